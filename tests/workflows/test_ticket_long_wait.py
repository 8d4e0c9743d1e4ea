"""A ticket that waits a long time for a decision keeps a bounded history: it continues as new at a reminder,
carrying its whole state, and the decision still reaches it (short reminder interval, low threshold)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine
from temporalio.client import Client

from daedalus import services as daedalus
from daedalus.schemas import search_attributes as sa
from daedalus.schemas.audit import AuditKind
from daedalus.schemas.ticket import Decision, TicketInput, TicketStatus
from daedalus.workflows.ticket import TicketWorkflow
from tests.support import make_engine_repo, running_workers, ticket_spec, wait_for
from tests.ticket_helpers import events, host_of
from tests.workflows.test_ticket_replay import replay_and_keep

LIMIT = 40


async def test_a_month_long_wait_continues_as_new_and_keeps_its_state(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    approval = {"dispatch_requires_approval": True, "deciders": ["wayne"], "reminder_interval_s": 1}
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=approval)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await temporal_client.start_workflow(
            TicketWorkflow.run,
            TicketInput(spec=spec, filed_by="wayne", history_limit=LIMIT),
            id=f"ticket-{spec.id}",
            task_queue=task_queue,
        )
        first_run = (await handle.describe()).run_id
        state = await wait_for(handle, lambda s: s.continued >= 2, timeout=90)
        request = state.pending_decision
        assert (
            request is not None and request.id == f"{spec.id}-dispatch-1"
        )  # the same request, not a new one
        assert state.status is TicketStatus.AWAITING_APPROVAL
        # Each run's history stays near the threshold, however long the wait.
        current = await temporal_client.get_workflow_handle(handle.id).fetch_history()
        assert len(current.events) < LIMIT + 20
        described = await temporal_client.get_workflow_handle(handle.id).describe()
        assert described.run_id != first_run
        # The UI still shows what the ticket waits for, and for whom.
        shown = described.typed_search_attributes
        assert (shown.get(sa.STATUS), shown.get(sa.WAITING_FOR), shown.get(sa.TICKET_ID)) == (
            "awaiting_approval",
            ["wayne"],
            spec.id,
        )
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="approve", decided_by="wayne"),
            store=sqlite_engine,
        )
        final = await temporal_client.get_workflow_handle_for(TicketWorkflow.run, handle.id).result()
    assert final.status is TicketStatus.PASSED and final.continued >= 2
    assert [d.request_id for d in final.decisions] == [request.id]
    trail = events(sqlite_engine, spec.id)
    # One trail across the runs: seqs 1..n with no gap or repeat, one filing, one request, one answer.
    assert [e.seq for e in sorted(trail, key=lambda e: e.seq)] == list(range(1, len(trail) + 1))
    assert {e.run_id for e in trail} == {first_run}
    counts = {kind: sum(1 for e in trail if e.kind == kind) for kind in AuditKind}
    assert (counts[AuditKind.FILED], counts[AuditKind.DECISION_REQUESTED], counts[AuditKind.DECIDED]) == (
        1,
        1,
        1,
    )
    assert counts[AuditKind.DECISION_REMINDER] >= 2
    assert final.audit_seq == len(trail)
    # The last run's history (it starts from the carry) replays, and is kept as a stored history.
    await replay_and_keep(temporal_client.get_workflow_handle(handle.id), "continued")
