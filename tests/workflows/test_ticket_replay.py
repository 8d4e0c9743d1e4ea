"""TicketWorkflow replays its stored histories: a change that breaks determinism for live tickets fails here.

The `record_*` tests run representative tickets on the real dev server and replay their fresh histories; with
DAEDALUS_RECORD_HISTORIES=1 they also (re)write tests/histories/ticket-<case>.json. Re-record only when a
workflow change is meant to be incompatible (and then patch the workflow for the tickets still live):

    DAEDALUS_RECORD_HISTORIES=1 .venv/bin/pytest tests/workflows/test_ticket_replay.py -k record

The stored histories were recorded when every audit event was a remote `record_audit_event` activity, except
ticket-passed-local-audit.json (the passed case since they are local activities, patch `audit-local-activity`):
tickets of both shapes are live somewhere, and both must replay.

The ticket-unbatched-*.json histories were recorded with every patch up to `ticket-lessons-read-locally`, each
audit event a local activity of its own, before `audit-batched-writes` (trail.py) let a ticket write consecutive
events in one: such tickets are live too.

The ticket-lazy-patches-*.json histories were recorded (with local audit writes) before `ticket-patches-at-start`:
they ask `waiting-for-delegates`, `children-build-on-predecessor`, `gates-hold-gpu-leases` and `ticket-lessons`
lazily, right after an audit write, as such tickets still live do. They replay as recorded; split after their
local activities they fail by design (tests/replay_split.py: the very problem the new patch avoids), so they are
not replayed split. Every other history is replayed split too.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import Replayer

from daedalus import services as daedalus
from daedalus.payloads import DATA_CONVERTER
from daedalus.schemas.ticket import (
    CancelRequest,
    Decision,
    DecisionKind,
    Delegation,
    SpecAmendment,
    TicketInput,
    TicketSpec,
    TicketStatus,
)
from daedalus.workflows.ticket import TicketWorkflow
from daedalus.workflows.ticket_patches import (
    CHILDREN_BUILD_ON_PREDECESSOR,
    PATCHES_AT_START,
    WAITING_FOR_DELEGATES,
)
from daedalus.workflows.ticket_steps import GATES_HOLD_LEASES
from tests.replay_split import local_activity_markers, replay_split_too
from tests.support import failing_spec, make_engine_repo, running_workers, ticket_spec
from tests.ticket_helpers import HISTORIES, events, host_of, pending

STORED = sorted(HISTORIES.glob("ticket-*.json"))
LOCAL_AUDIT = "ticket-passed-local-audit.json"
LAZY_PATCHES = "ticket-lazy-patches-"
UNBATCHED = "ticket-unbatched-"
BATCHED = "ticket-batched-"
"""Histories recorded with audit writes batched (the way tickets write now), by the tests of the patches that came
after it: tests/workflows/test_ticket_parent_seed.py."""
CASES = {"passed", "escalated-stopped", "umbrella", "umbrella-chained", "cancelled", "continued"}


def replayer() -> Replayer:
    return Replayer(workflows=[TicketWorkflow], data_converter=DATA_CONVERTER)


async def replay_and_keep(handle: WorkflowHandle[Any, Any], case: str) -> None:
    history = await handle.fetch_history()
    await replay_split_too(replayer(), history)
    if os.environ.get("DAEDALUS_RECORD_HISTORIES"):
        (HISTORIES / f"ticket-{case}.json").write_text(history.to_json())


def audit_writes(history: WorkflowHistory) -> tuple[int, int, int]:
    """(remote, local) `record_audit_event` activities in a history, and its `record_audit_events` batches."""
    remote = sum(
        1
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "record_audit_event"
    )
    local = local_activity_markers(history, "record_audit_event")
    return remote, local, local_activity_markers(history, "record_audit_events")


def test_every_case_has_a_stored_history() -> None:
    assert {p.stem.removeprefix("ticket-") for p in STORED} >= CASES


@pytest.mark.parametrize("path", STORED, ids=[p.stem for p in STORED])
def test_stored_histories_hold_the_older_ways_of_writing_audit_events(path: Path) -> None:
    writes = audit_writes(WorkflowHistory.from_json(path.stem, path.read_text()))
    remote, local, batches = writes
    if path.name == LOCAL_AUDIT or path.name.startswith((LAZY_PATCHES, UNBATCHED)):
        assert remote == 0 and local > 0 and batches == 0, writes
    elif path.name.startswith(BATCHED):
        assert remote == 0 and batches > 0, writes
    else:
        assert remote > 0 and local == 0 and batches == 0, writes


@pytest.mark.parametrize("path", STORED, ids=[p.stem for p in STORED])
async def test_stored_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(f"replay-{path.stem}", path.read_text())
    if path.name.startswith(LAZY_PATCHES):
        result = await replayer().replay_workflow(history)
    else:
        result = await replay_split_too(replayer(), history)
    assert result.replay_failure is None


@pytest.mark.parametrize("path", sorted(HISTORIES.glob(f"{LAZY_PATCHES}*.json")), ids=lambda p: p.stem)
def test_lazy_patch_histories_ask_the_old_patches_and_not_the_new_one(path: Path) -> None:
    """What the histories guard: runs started before `ticket-patches-at-start` ask the old patches lazily."""
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    asked = patches(history)
    assert PATCHES_AT_START not in asked, asked
    assert asked & {WAITING_FOR_DELEGATES, CHILDREN_BUILD_ON_PREDECESSOR, GATES_HOLD_LEASES}, asked


def patches(history: WorkflowHistory) -> set[str]:
    """The ids of the patches a history's run asked (and found on)."""
    return {
        json.loads(e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data)["id"]
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    }


@workflow.defn(name="TicketWorkflow", sandboxed=False)
class ReorderedTicket:
    """A 'change' to TicketWorkflow that waits before its first audit event: not compatible with live tickets."""

    @workflow.run
    async def run(self, ticket: TicketInput) -> None:
        await workflow.sleep(1)


async def test_replay_rejects_an_incompatible_change() -> None:
    """The check above can fail: the same histories against a reordered workflow are nondeterministic."""
    [path, *_] = STORED
    history = WorkflowHistory.from_json("replay-changed", path.read_text())
    changed = Replayer(workflows=[ReorderedTicket], data_converter=DATA_CONVERTER)
    with pytest.raises(workflow.NondeterminismError):
        await changed.replay_workflow(history)


async def test_the_control_history_must_fail_replay() -> None:
    """A stored history whose first step is a build where the workflow writes its filing event: replaying it
    must fail, so a replayer that silently accepted anything would be caught here."""
    text = (HISTORIES / "control-ticket-must-fail.json").read_text()
    history = WorkflowHistory.from_json("replay-control", text)
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert isinstance(result.replay_failure, workflow.NondeterminismError)
    assert "run_build" in str(result.replay_failure)


async def test_record_passed_after_delegated_approval(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"),
        host,
        approval={"dispatch_requires_approval": True, "deciders": ["wayne"], "reminder_interval_s": 1},
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        _, request = await pending(handle)
        await daedalus.delegate(
            temporal_client,
            spec.id,
            Delegation(granted_by="wayne", delegate="lead", kind=DecisionKind.DISPATCH),
        )
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="approve", decided_by="lead"),
            store=sqlite_engine,
        )
        final = await handle.result()
        assert final.status is TicketStatus.PASSED
    # Audit events are written in batches of consecutive events, each batch one local-activity marker: no
    # remote activity, no workflow task of its own, and fewer writes than events.
    remote, local, batches = audit_writes(await handle.fetch_history())
    assert (remote, local) == (0, 0) and 0 < batches < final.audit_seq, (batches, final.audit_seq)
    assert [e.seq for e in events(sqlite_engine, spec.id)] == list(range(1, final.audit_seq + 1))
    await replay_and_keep(handle, "passed")


async def test_record_escalated_amended_then_stopped(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = failing_spec(tmp_path, host, max_attempts=3)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        _, request = await pending(handle)
        await daedalus.amend(
            temporal_client, spec.id, SpecAmendment(amended_by="wayne", spec="try the fused kernel")
        )
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="stop", decided_by="wayne"),
            store=sqlite_engine,
        )
        assert (await handle.result()).status is TicketStatus.STOPPED_BY_RULES
    await replay_and_keep(handle, "escalated-stopped")


async def test_record_umbrella_with_a_child(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    kid = ticket_spec(make_engine_repo(tmp_path / "repo"), host, id=f"k{uuid.uuid4().hex[:7]}")
    parent = TicketSpec.model_validate(
        {
            "id": f"u{uuid.uuid4().hex[:8]}",
            "title": "umbrella",
            "kind": "umbrella",
            "host": host,
            "children": [kid.model_dump(mode="json")],
        }
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, parent, queue=task_queue)
        assert (await handle.result()).status is TicketStatus.PASSED
    await replay_and_keep(handle, "umbrella")


NOTES_PATCH = "--- /dev/null\n+++ b/notes.txt\n@@ -0,0 +1 @@\n+fused kernel on top of the align-tax fix\n"


async def test_record_umbrella_whose_second_child_builds_on_the_first(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    """Sub-tickets in sequence build on each other (6d's fix is under 6e): the second child names no base, so it
    starts from the first child's accepted commit, whose speed patch is what lets its decode gate pass."""
    host = host_of(task_queue)
    repo = make_engine_repo(tmp_path / "repo")
    engine = {"name": "toy", "kind": "llama_cpp", "repo": str(repo)}  # base_commit: the default, HEAD
    first = ticket_spec(repo, host, id=f"d{uuid.uuid4().hex[:7]}", engine=engine)
    second = ticket_spec(
        repo,
        host,
        id=f"e{uuid.uuid4().hex[:7]}",
        engine=engine,
        agent={"name": "scripted", "patch": NOTES_PATCH},
    )
    parent = TicketSpec.model_validate(
        {
            "id": f"u{uuid.uuid4().hex[:8]}",
            "title": "chained umbrella",
            "kind": "umbrella",
            "host": host,
            "children": [first.model_dump(mode="json"), second.model_dump(mode="json")],
        }
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, parent, queue=task_queue)
        final = await handle.result()
        one, two = [await daedalus.status(temporal_client, c.id) for c in (first, second)]
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    [accepted] = [a.commit for a in one.attempts]
    assert accepted and two.spec.engine is not None and two.spec.engine.base_commit == accepted
    [built] = [a.commit for a in two.attempts]
    parent_of_built = subprocess.run(
        ["git", "rev-parse", f"{built}^"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()
    assert parent_of_built == accepted
    await replay_and_keep(handle, "umbrella-chained")


async def test_record_cancelled_while_awaiting_approval(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"), host, approval={"dispatch_requires_approval": True}
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        await pending(handle)
        await daedalus.cancel(
            temporal_client, spec.id, CancelRequest(requested_by="wayne", reason="duplicate of 5")
        )
        assert (await handle.result()).status is TicketStatus.CANCELLED
    await replay_and_keep(handle, "cancelled")
