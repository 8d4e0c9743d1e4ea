"""notify_decision_request with the real slack_sdk WebClient against the local fake Slack."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import SecretStr
from slack_sdk.errors import SlackApiError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from daedalus.activities.notify import NotifyActivities
from daedalus.errors import SlackUnavailable
from daedalus.schemas.notify import NotifyOutcome
from daedalus.schemas.ticket import DecisionKind, DecisionRequest
from daedalus.slack.settings import SlackSettings
from tests.slack.fake_slack import FakeSlack, running_fake_slack


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with running_fake_slack() as fake:
        yield fake


def settings_for(slack: FakeSlack, **changes: object) -> SlackSettings:
    values: dict[str, object] = {
        "bot_token": SecretStr(slack.token),
        "channel": slack.channels[0],
        "base_url": slack.base_url,
    }
    values.update(changes)
    return SlackSettings.model_validate(values)


def request(reminders: int = 0) -> DecisionRequest:
    return DecisionRequest(
        id="t42-dispatch-1",
        ticket_id="t42",
        kind=DecisionKind.DISPATCH,
        question="Dispatch ticket t42 (MTP align tax fix) to scripted on h1?",
        options=["approve", "reject"],
        evidence=["spec: make decode reach 55 tok/s", "gates: decode_tps >= 55"],
        deciders=["wayne"],
        requested_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        reminders_sent=reminders,
    )


async def test_posts_one_button_per_option_once_and_reminders_in_thread(
    slack: FakeSlack, tmp_path: Path
) -> None:
    activities = NotifyActivities(settings_for(slack), tmp_path / "ledger")
    env = ActivityEnvironment()
    first = await env.run(activities.notify_decision_request, request())
    assert first.outcome is NotifyOutcome.POSTED and first.ts and first.channel == "C0DECISIONS"
    [post] = slack.posts
    assert post["ts"] == first.ts and "t42-dispatch-1" in post["text"]
    [actions] = [b for b in post["blocks"] if b["type"] == "actions"]
    values = [json.loads(e["value"]) for e in actions["elements"]]
    assert values == [
        {"request_id": "t42-dispatch-1", "option": "approve"},
        {"request_id": "t42-dispatch-1", "option": "reject"},
    ]
    assert all(e["action_id"].startswith("decide") for e in actions["elements"])
    assert "wayne" in json.dumps(post["blocks"]) and "decode_tps" in json.dumps(post["blocks"])

    # A retried activity (same request, same reminder count) finds the first post and posts nothing.
    again = await env.run(activities.notify_decision_request, request())
    assert again.outcome is NotifyOutcome.ALREADY_POSTED and again.ts == first.ts
    assert len(slack.posts) == 1

    reminder = await env.run(activities.notify_decision_request, request(reminders=1))
    assert reminder.outcome is NotifyOutcome.POSTED and reminder.ts != first.ts
    assert slack.posts[1]["thread_ts"] == first.ts and slack.posts[1]["text"].startswith("Reminder 1")
    assert not slack.refused


async def test_without_a_token_it_says_not_configured(slack: FakeSlack, tmp_path: Path) -> None:
    activities = NotifyActivities(SlackSettings(bot_token=None, channel=None), tmp_path / "ledger")
    result = await ActivityEnvironment().run(activities.notify_decision_request, request())
    assert result.outcome is NotifyOutcome.NOT_CONFIGURED and "DAEDALUS_SLACK_BOT_TOKEN" in result.detail
    assert not slack.posts and not slack.refused


async def test_a_permanent_refusal_is_reported_and_not_remembered(slack: FakeSlack, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    wrong = NotifyActivities(settings_for(slack, bot_token=SecretStr("xoxb-revoked")), ledger)
    result = await ActivityEnvironment().run(wrong.notify_decision_request, request())
    assert result.outcome is NotifyOutcome.FAILED and "invalid_auth" in result.detail
    lost = NotifyActivities(settings_for(slack, channel="C0GONE"), ledger)
    result = await ActivityEnvironment().run(lost.notify_decision_request, request())
    assert result.outcome is NotifyOutcome.FAILED and "channel_not_found" in result.detail
    assert not slack.posts and [e for e, _ in slack.refused] == ["invalid_auth", "channel_not_found"]
    # Nothing was recorded as posted: once fixed, the request is posted.
    fixed = NotifyActivities(settings_for(slack), ledger)
    result = await ActivityEnvironment().run(fixed.notify_decision_request, request())
    assert result.outcome is NotifyOutcome.POSTED and len(slack.posts) == 1


async def test_a_rate_limit_is_retried_by_temporal_then_given_up(slack: FakeSlack, tmp_path: Path) -> None:
    activities = NotifyActivities(settings_for(slack), tmp_path / "ledger")
    env = ActivityEnvironment()
    slack.rate_limit_next = 1
    with pytest.raises(ApplicationError) as transient:
        await env.run(activities.notify_decision_request, request())
    assert transient.value.type == SlackUnavailable.type_name and not transient.value.non_retryable
    assert isinstance(transient.value.__cause__, SlackUnavailable)
    assert isinstance(transient.value.__cause__.__cause__, SlackApiError)
    slack.rate_limit_next = 1
    env.info = dataclasses.replace(env.info, attempt=3)
    result = await env.run(activities.notify_decision_request, request())
    assert result.outcome is NotifyOutcome.FAILED and "ratelimited" in result.detail
    assert not slack.posts
