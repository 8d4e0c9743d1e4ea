"""A new ticket records one patch marker (the bundle, `ticket-patches-bundled`), and so one upsert of Temporal's
`TemporalChangeVersion` search attribute where it recorded ten (bench/reference/lifecycle-profile.md), and runs as
every bundled patch says. Histories recorded before it replay as they were (tests/workflows/test_ticket_replay.py)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine
from temporalio.client import Client, WorkflowHistory

from daedalus import services as daedalus
from daedalus.schemas.ticket import Decision, TicketStatus
from daedalus.workflows.ticket_patches import PATCHES_BUNDLED
from tests.replay_split import local_activity_markers, replay_split_too
from tests.support import make_engine_repo, running_workers, ticket_spec
from tests.ticket_helpers import events, host_of, pending
from tests.workflows.test_ticket_replay import audit_writes, patches, replayer


def change_version_upserts(history: WorkflowHistory) -> int:
    return sum(
        1
        for e in history.events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
        and "TemporalChangeVersion"
        in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    )


async def test_a_new_ticket_records_one_patch_and_runs_as_the_bundled_patches_say(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"),
        host,
        approval={"dispatch_requires_approval": True, "deciders": ["wayne"]},
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        _, request = await pending(handle)
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="approve", decided_by="wayne"),
            store=sqlite_engine,
        )
        final = await handle.result()
    assert final.status is TicketStatus.PASSED
    history = await handle.fetch_history()
    assert patches(history) == {PATCHES_BUNDLED}
    assert change_version_upserts(history) == 1
    # What the bundle holds is on: audit events batched in local activities (`audit-batched-writes`,
    # `audit-local-activity`), the lessons read locally (`ticket-lessons-read-locally`).
    remote, local, batches = audit_writes(history)
    assert (remote, local) == (0, 0) and 0 < batches < final.audit_seq, (remote, local, batches)
    assert local_activity_markers(history, "lessons_for") == 1
    assert [e.seq for e in events(sqlite_engine, spec.id)] == list(range(1, final.audit_seq + 1))
    await replay_split_too(replayer(), history)
