"""Umbrella tickets: children run as child workflows `ticket-<child id>`, one after another, on the real server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus import client as daedalus
from daedalus.errors import TicketError
from daedalus.schemas.gates import Verdict
from daedalus.schemas.ticket import CancelRequest, Decision, TicketSpec, TicketState, TicketStatus
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.ticket import TicketWorkflow
from tests.support import SLOW_PATCH, gate_command, make_engine_repo, running_workers, ticket_spec, wait_for
from tests.ticket_helpers import events, host_of, pending, started


def umbrella(repo: Path, host: str, *children: TicketSpec) -> TicketSpec:
    return TicketSpec.model_validate(
        {
            "id": f"u{uuid.uuid4().hex[:8]}",
            "title": "MTP umbrella (test)",
            "kind": "umbrella",
            "host": host,
            "agent": None,
            "children": [c.model_dump(mode="json") for c in children],
        }
    )


def child(repo: Path, host: str, name: str, **overrides: Any) -> TicketSpec:
    return ticket_spec(
        repo, host, id=f"{name}{uuid.uuid4().hex[:6]}", title=f"sub-ticket {name}", **overrides
    )


async def test_umbrella_runs_children_in_order_and_passes_when_both_pass(
    temporal_client: Client, store_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    repo = make_engine_repo(tmp_path / "repo")
    first, second = child(repo, host, "b"), child(repo, host, "c")
    parent = umbrella(repo, host, first, second)
    async with running_workers(temporal_client, store_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, parent, queue=task_queue)
        final = await handle.result()
        kids = [
            await temporal_client.get_workflow_handle(f"ticket-{c.id}").describe() for c in (first, second)
        ]
        child_states = [await daedalus.status(temporal_client, c.id) for c in (first, second)]
    assert final.status is TicketStatus.PASSED and final.outcome_reason == "all sub-tickets passed"
    assert final.children == {first.id: TicketStatus.PASSED, second.id: TicketStatus.PASSED}
    assert all(k.parent_id == f"ticket-{parent.id}" for k in kids)
    assert [s.spec.parent for s in child_states] == [parent.id, parent.id]
    assert all(s.status is TicketStatus.PASSED for s in child_states)
    # In order: the second child is filed only after the first one closed.
    one, two = events(store_engine, first.id), events(store_engine, second.id)
    assert one[-1].status == "passed" and two[0].kind == "filed" and one[-1].at <= two[0].at
    assert two[0].actor == f"ticket {parent.id}"
    trail = [r.summary for r in events(store_engine, parent.id) if r.kind == "child"]
    assert [t.split(":")[0] for t in trail] == [
        f"sub-ticket {first.id} started",
        f"sub-ticket {first.id} closed passed",
        f"sub-ticket {second.id} started",
        f"sub-ticket {second.id} closed passed",
    ]
    with session_scope(store_engine) as session:
        rows = {t.ticket_id: t for t in queries.list_tickets(session=session)}
    assert rows[first.id].parent == parent.id and rows[second.id].parent == parent.id
    assert rows[parent.id].status == "passed" and rows[parent.id].agent is None


async def test_a_failing_child_fails_the_umbrella_and_names_the_child(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    repo = make_engine_repo(tmp_path / "repo")
    bad = child(repo, host, "b", agent={"name": "scripted", "patch": SLOW_PATCH}, max_attempts=1)
    good = child(repo, host, "c")
    parent = umbrella(repo, host, bad, good)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, parent, queue=task_queue)
        bad_handle = await started(temporal_client, bad.id)
        _, request = await pending(bad_handle)
        assert request.id == f"{bad.id}-escalation-1"
        state = await handle.query(TicketWorkflow.state)
        assert state.status is TicketStatus.RUNNING_CHILDREN and state.children == {
            bad.id: TicketStatus.DRAFT
        }
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="fail", decided_by="wayne", note="40 tok/s"),
        )
        final = await handle.result()
    assert final.status is TicketStatus.FAILED
    assert final.outcome_reason == f"sub-tickets did not pass: {{'{bad.id}': 'failed'}}"
    assert final.children == {bad.id: TicketStatus.FAILED, good.id: TicketStatus.PASSED}
    closing = events(sqlite_engine, parent.id)[-1]
    assert closing.status == "failed" and bad.id in closing.summary and good.id not in closing.summary


async def _cancel_umbrella_while_first_child_waits(
    client: Client, engine: Engine, tmp_path: Path, task_queue: str
) -> tuple[TicketState, TicketState, TicketSpec, list[str]]:
    host = host_of(task_queue)
    repo = make_engine_repo(tmp_path / "repo")
    waiting = child(repo, host, "b", approval={"dispatch_requires_approval": True})
    never = child(repo, host, "c")
    parent = umbrella(repo, host, waiting, never)
    async with running_workers(client, engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(client, parent, queue=task_queue)
        await pending(await started(client, waiting.id))
        await daedalus.cancel(client, parent.id, CancelRequest(requested_by="wayne", reason="replanned"))
        final = await handle.result()
        kid_state = await daedalus.status(client, waiting.id)
        with pytest.raises(TicketError, match=f"no ticket {never.id}"):
            await daedalus.status(client, never.id)
    assert events(engine, never.id) == []
    return final, kid_state, never, [r.summary for r in events(engine, parent.id)]


async def test_cancelling_the_umbrella_cancels_the_running_child(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    final, kid, never, trail = await _cancel_umbrella_while_first_child_waits(
        temporal_client, sqlite_engine, tmp_path, task_queue
    )
    assert final.status is TicketStatus.CANCELLED and final.outcome_reason == "cancelled by wayne: replanned"
    assert kid.status is TicketStatus.CANCELLED and kid.pending_decision is None
    # The child that never started is neither in the state nor in the audit trail.
    assert never.id not in final.children
    assert not [s for s in trail if never.id in s], trail


@pytest.mark.parametrize(("speed", "status"), [("56.0", TicketStatus.PASSED), ("28.9", TicketStatus.FAILED)])
async def test_a_ticket_without_agent_measures_its_engine_as_it_stands(
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
    speed: str,
    status: TicketStatus,
) -> None:
    """A measurement-only ticket: its gate runs on the engine at the base commit, and its verdict is the outcome."""
    host = host_of(task_queue)
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo", speed=speed),
        host,
        agent=None,
        build=None,
        approval={"dispatch_requires_approval": False, "inconclusive_reruns": 0},
        gates=[{"name": "decode", "metric": "decode_tps", "threshold": 55, "command": gate_command()}],
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        final = await wait_for(handle, lambda s: s.status.is_closed or s.pending_decision is not None)
        if not final.status.is_closed:
            await handle.terminate("test over")
    assert final.status is status, (final.outcome_reason, final.attempts)
    [attempt] = final.attempts
    [gate] = attempt.gate_results
    assert gate.verdict is (Verdict.PASS if status is TicketStatus.PASSED else Verdict.FAIL)
    assert gate.median is not None and abs(gate.median - float(speed)) < 0.5
    assert final.pending_decision is None and final.decisions == []  # nobody was asked
