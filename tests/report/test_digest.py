"""The report digest: a Temporal schedule starts ReportDigestWorkflow, which writes the HTML report and posts
a short summary with a link to Slack (the real slack_sdk client against the local fake Slack), naming the
tickets stuck on a host no worker polls (asked of the real dev server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr
from sqlalchemy import Engine
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from daedalus.activities.report import ReportActivities
from daedalus.hosts.registry import HostSpec, Registry
from daedalus.schemas.notify import NotifyOutcome
from daedalus.schemas.report import DigestInput
from daedalus.services.report_schedule import ensure_digest_schedule
from daedalus.slack.settings import SlackSettings
from tests.report.seeded import fill
from tests.slack.fake_slack import FakeSlack, running_fake_slack
from tests.support import running_workers

LINK = "https://daedalus.example/report"


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with running_fake_slack() as fake:
        yield fake


def settings(slack: FakeSlack) -> SlackSettings:
    return SlackSettings(bot_token=SecretStr(slack.token), channel=slack.channels[0], base_url=slack.base_url)


def hosts_file(tmp_path: Path) -> Path:
    """A registry naming mavis, where the seeded ticket 6f was dispatched; no test runs a worker for it."""
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(Registry(hosts=[HostSpec(name="mavis")]).model_dump(mode="json")))
    return path


STUCK = "• 6f: queued for host-mavis since "
NOBODY = "; no worker polls it; run `daedalus worker --host mavis` there"


async def test_schedule_posts_a_summary_with_a_link(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str, slack: FakeSlack
) -> None:
    fill(sqlite_engine, tmp_path / "curves")
    schedule_id = f"digest-{task_queue}"
    async with running_workers(
        temporal_client,
        sqlite_engine,
        tmp_path,
        task_queue,
        "h-digest",
        slack=settings(slack),
        hosts_file=hosts_file(tmp_path),
    ):
        handle = await ensure_digest_schedule(
            temporal_client,
            control_queue=task_queue,
            every=timedelta(hours=24),
            request=DigestInput(window_hours=6, link=LINK),
            schedule_id=schedule_id,
        )
        try:
            # the same call again updates the schedule instead of failing or making a second one
            again = await ensure_digest_schedule(
                temporal_client,
                control_queue=task_queue,
                every=timedelta(hours=12),
                request=DigestInput(window_hours=6, link=LINK),
                schedule_id=schedule_id,
            )
            assert again.id == handle.id
            described = await handle.describe()
            assert described.schedule.spec.intervals[0].every == timedelta(hours=12)
            await handle.trigger()
            deadline = time.monotonic() + 60
            while not slack.posts:
                assert time.monotonic() < deadline, f"nothing posted; refused: {slack.refused}"
                await asyncio.sleep(0.2)
        finally:
            await handle.delete()
    [post] = slack.posts
    text = post["text"]
    assert text.startswith("*Progress report since")
    assert (
        "Tickets: 5 (1 awaiting approval, 1 awaiting decision, 1 closed under exception, 1 dispatched, 1 running children)"
        in text
    )
    assert "Decisions waiting: 2; decided in the window: 1" in text
    assert "Campaigns: 1, 1 crashed cells" in text and "Training runs: 1, 2 deaths" in text
    assert "Waiting on a host no worker polls: 1" in text
    [stuck] = [line for line in text.splitlines() if line.startswith(STUCK)]
    assert stuck.endswith(NOBODY), stuck
    assert f"<{LINK}|Full report>" in text
    latest = tmp_path / "artifacts" / "reports" / "latest.html"
    assert latest.is_file() and latest.read_text().count("<svg") == 3
    assert "Waiting on a host no worker polls" in latest.read_text(), (
        "the full report names what the digest does"
    )


async def test_digest_posts_once_per_run_and_says_when_slack_is_off(
    sqlite_engine: Engine, tmp_path: Path, slack: FakeSlack
) -> None:
    fill(sqlite_engine, tmp_path / "curves")
    env = ActivityEnvironment()  # no Temporal client: a digest without a registry never asks it
    activities = ReportActivities(sqlite_engine, settings(slack), tmp_path / "artifacts")
    first = await env.run(activities.post_report_digest, DigestInput(window_hours=6))
    retry = await env.run(activities.post_report_digest, DigestInput(window_hours=6))
    assert first.notify.outcome is NotifyOutcome.POSTED
    assert retry.notify.outcome is NotifyOutcome.ALREADY_POSTED and len(slack.posts) == 1
    assert "Full report" not in first.summary, "no link given, none made up"
    assert "Waiting on a host" not in first.summary, "no registry, no claim about hosts"
    off = ReportActivities(sqlite_engine, SlackSettings(bot_token=None, channel=None), tmp_path / "off")
    result = await env.run(off.post_report_digest, DigestInput(window_hours=6))
    assert (
        result.notify.outcome is NotifyOutcome.NOT_CONFIGURED
        and "DAEDALUS_SLACK_BOT_TOKEN" in result.notify.detail
    )
    assert Path(result.html_path).is_file()


async def test_an_unreadable_registry_leaves_the_host_lines_out_and_the_digest_posts(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, slack: FakeSlack
) -> None:
    fill(sqlite_engine, tmp_path / "curves")
    env = ActivityEnvironment(client=temporal_client)
    broken = tmp_path / "broken.yaml"
    broken.write_text("hosts: [{name: mavis, gpus: many}]\n")
    activities = ReportActivities(sqlite_engine, settings(slack), tmp_path / "artifacts", broken)
    result = await env.run(activities.post_report_digest, DigestInput(window_hours=6))
    assert result.notify.outcome is NotifyOutcome.POSTED and "Decisions waiting: 2" in result.summary
    assert "Waiting on a host" not in result.summary
    fixed = ReportActivities(sqlite_engine, settings(slack), tmp_path / "artifacts", hosts_file(tmp_path))
    again = await env.run(fixed.post_report_digest, DigestInput(window_hours=6))
    assert again.notify.outcome is NotifyOutcome.ALREADY_POSTED, "one post per digest run, lines or not"
    assert STUCK in again.summary and NOBODY in again.summary
