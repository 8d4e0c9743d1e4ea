"""What a person sees of tickets in the Temporal UI, read the way the UI reads it from a real dev server:
list filters on the search attributes (the saved views of the README), a workflow's static summary and details,
its current details (the `__temporal_workflow_metadata` query) and its activities' summaries on the timeline."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import Engine
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle
from typer.testing import CliRunner

from daedalus import services as daedalus
from daedalus.cli import app
from daedalus.devserver import DevServer
from daedalus.schemas import search_attributes as sa
from daedalus.schemas.ticket import CancelRequest, Decision, DecisionKind, Delegation, TicketStatus
from daedalus.schemas.ui import SUMMARY_LIMIT, start_summary
from daedalus.services.training import start_run
from tests.replay_split import replay_split_too
from tests.support import make_engine_repo, running_workers, ticket_spec
from tests.ticket_helpers import host_of, pending
from tests.workflows.test_ticket_replay import replayer
from tests.workflows.test_training import ROOT, make_spec


async def listed(client: Client, query: str, expected: set[str], timeout: float = 30) -> set[str]:
    """The workflow ids the list filter `query` shows, once visibility (eventually consistent) shows `expected`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        ids = {execution.id async for execution in client.list_workflows(query)}
        if ids == expected or asyncio.get_running_loop().time() > deadline:
            return ids
        await asyncio.sleep(0.3)


async def current_details(handle: WorkflowHandle[Any, Any]) -> str:
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def test_saved_views_find_who_a_ticket_waits_for_and_how_it_ended(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    repo = make_engine_repo(tmp_path / "repo")
    approval = {
        "dispatch_requires_approval": True,
        "deciders": ["wayne"],
        "delegates": {"dispatch": ["lead"]},
    }
    delegated = ticket_spec(repo, host, approval=approval, title="Delegated dispatch (test)")
    alone = ticket_spec(repo, host, approval={**approval, "delegates": {}}, title="Wayne alone (test)")
    mine = f'DaedalusHost = "{host}"'  # this test's tickets only: the dev server is shared by the session
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        first = await daedalus.file_ticket(temporal_client, delegated, queue=task_queue)
        second = await daedalus.file_ticket(temporal_client, alone, queue=task_queue)
        _, request = await pending(first)
        await pending(second)
        both = {first.id, second.id}
        # Everything waiting for Wayne, delegated or not; only the delegated one waits for the lead too.
        assert await listed(temporal_client, f'{mine} AND DaedalusWaitingFor = "wayne"', both) == both
        assert await listed(temporal_client, f'{mine} AND DaedalusWaitingFor = "lead"', {first.id}) == {
            first.id
        }
        shown = (await first.describe()).typed_search_attributes
        assert shown.get(sa.WAITING_FOR) == ["wayne", "lead"]
        assert shown.get(sa.STATUS) == "awaiting_approval" and shown.get(sa.OUTCOME) is None

        described = await first.describe()
        assert await described.static_summary() == start_summary(delegated)
        assert "gate `decode`: decode_tps >= 55" in (await described.static_details() or "")
        details = await current_details(first)
        assert details.startswith(f"### {delegated.id}: Delegated dispatch (test)")
        assert "**awaiting approval**" in details and "waiting for wayne, lead" in details

        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="approve", decided_by="lead"),
            store=sqlite_engine,
        )
        await daedalus.cancel(
            temporal_client, alone.id, CancelRequest(requested_by="wayne", reason="not this week")
        )
        assert (await first.result()).status is TicketStatus.PASSED
        assert (await second.result()).status is TicketStatus.CANCELLED

        # Closed: both COMPLETED in Temporal's terms, told apart by DaedalusOutcome and their details.
        assert await listed(temporal_client, f'{mine} AND DaedalusOutcome = "passed"', {first.id}) == {
            first.id
        }
        assert await listed(temporal_client, f'{mine} AND DaedalusOutcome = "cancelled"', {second.id}) == {
            second.id
        }
        assert await listed(temporal_client, f'{mine} AND DaedalusWaitingFor = "wayne"', set()) == set()
        assert (await current_details(first)).startswith(
            f"### {delegated.id}: Delegated dispatch (test)\n\n**✅ passed**"
        )
        assert "**🚫 cancelled**" in await current_details(second)

    # The timeline names each step: the agent's attempt, the build, and the gate with its rule and round.
    history = await first.fetch_history()
    await replay_split_too(replayer(), history)
    summaries = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and event.HasField(
            "user_metadata"
        ):
            payload = event.user_metadata.summary
            summaries.append(temporal_client.data_converter.payload_converter.from_payload(payload, str))
    assert f"attempt 1: scripted on {host}" in summaries
    assert f"build attempt 1 on {host}" in summaries
    assert "gate decode: decode_tps >= 55 (attempt 1, round 1)" in summaries


async def test_a_run_time_delegate_shows_in_the_waiting_for_view(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    approval = {"dispatch_requires_approval": True, "deciders": ["wayne"]}
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=approval)
    lead_waits = f'DaedalusHost = "{host}" AND DaedalusWaitingFor = "lead"'
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        await pending(handle)
        assert await listed(temporal_client, lead_waits, set(), timeout=1) == set()
        await daedalus.delegate(
            temporal_client,
            spec.id,
            Delegation(granted_by="wayne", delegate="lead", kind=DecisionKind.DISPATCH),
        )
        assert await listed(temporal_client, lead_waits, {handle.id}) == {handle.id}
        shown = (await handle.describe()).typed_search_attributes
        assert shown.get(sa.WAITING_FOR) == ["wayne", "lead"]
        assert "waiting for wayne, lead" in await current_details(handle)
        await daedalus.cancel(
            temporal_client, spec.id, CancelRequest(requested_by="lead", reason="test over")
        )
        assert (await handle.result()).status is TicketStatus.CANCELLED
    await replay_split_too(replayer(), await handle.fetch_history())


async def test_training_runs_and_campaigns_start_with_their_host_and_a_summary(
    temporal_client: Client, temporal_server: DevServer, tmp_path: Path, task_queue: str
) -> None:
    """No worker is needed: both are set on the start request, before the workflow runs."""
    host = host_of(task_queue)
    run = make_spec(tmp_path, host=host)
    started = await start_run(temporal_client, run, queue=task_queue)
    campaign = yaml.safe_load((ROOT / "examples" / "campaigns" / "local-wall.yaml").read_text())
    campaign.update(id=f"wall-{task_queue[-8:]}", host=host)
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(campaign))
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [{"name": host}]}))
    env = {
        "DAEDALUS_HOSTS_FILE": str(tmp_path / "hosts.yaml"),
        "DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address,
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "DAEDALUS_CONTROL_QUEUE": task_queue,
    }
    start_campaign = ["campaign", "start", "-f", str(tmp_path / "campaign.yaml")]
    result = await asyncio.to_thread(
        CliRunner().invoke, app, start_campaign, env=env
    )  # the CLI runs its own loop
    assert result.exit_code == 0, result.output
    filed = temporal_client.get_workflow_handle(f"campaign-{campaign['id']}")
    try:
        # The training command holds pytest's temporary path, whose length varies from run to run: the
        # summary starts with the run, its host and its program, and is clipped to the list's limit.
        for handle, summary in (
            (started, f"training run {run.name} on {host}: {' '.join(run.command)}"),
            (filed, f"campaign {campaign['id']}: {campaign['title']} ({host})"),
        ):
            described = await handle.describe()
            assert described.typed_search_attributes.get(sa.HOST) == host
            shown = await described.static_summary()
            assert shown is not None and len(shown) <= SUMMARY_LIMIT
            if len(summary) <= SUMMARY_LIMIT:
                assert shown == summary
            else:
                assert shown == summary[: SUMMARY_LIMIT - 1] + "…"
        on_host = {started.id, filed.id}
        assert await listed(temporal_client, f'DaedalusHost = "{host}"', on_host) == on_host
    finally:
        await started.terminate("test over")
        await filed.terminate("test over")


async def test_the_readmes_saved_views_are_queries_the_server_accepts(temporal_client: Client) -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("### The Temporal UI", 1)[1].split("\n### ", 1)[0]
    views = re.findall(r"^\| [^|]+ \| `(.+)` \|$", section, flags=re.MULTILINE)
    assert len(views) >= 5 and any("DaedalusWaitingFor" in view for view in views)
    for view in views:
        [_ async for _ in temporal_client.list_workflows(view, limit=1)]  # an invalid query raises
