"""The audit store on SQLite and PostgreSQL: `apply` writes each event once (`apply_all` a batch of them), the
projection, and the queries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, func
from sqlmodel import select

from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord, TicketSnapshot
from daedalus.schemas.gates import GateResult, Metric, Verdict
from daedalus.schemas.ticket import Decision, DecisionKind, DecisionRequest
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.store.records import apply, apply_all
from daedalus.store.tables import AuditEventRow, DecisionRow, TicketRow, VerdictRow
from tests.support import TEST_AUDIT_KEY

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def record(
    seq: int,
    *,
    run_id: str = "run-1",
    ticket_id: str = "4",
    status: str = "dispatched",
    kind: AuditKind = AuditKind.TRANSITION,
    actor: str = "daedalus",
    at: datetime | None = None,
    title: str = "MTP align tax",
    spec: dict[str, object] | None = None,
    detail: dict[str, str] | None = None,
    **extra: object,
) -> AuditRecord:
    at = at or T0 + timedelta(minutes=seq)
    return AuditRecord(
        event=AuditEvent(
            workflow_id=f"ticket-{ticket_id}",
            run_id=run_id,
            seq=seq,
            ticket_id=ticket_id,
            kind=kind,
            actor=actor,
            at=at,
            status=status,
            summary=f"{kind.value} {seq}",
            detail=detail or {"n": str(seq)},
        ),
        ticket=TicketSnapshot(
            ticket_id=ticket_id,
            workflow_id=f"ticket-{ticket_id}",
            run_id=run_id,
            title=title,
            parent=None,
            kind="fix",
            host="pc",
            engine="llama.cpp-mtp",
            agent="scripted",
            status=status,
            attempts=seq // 3,
            awaiting=None,
            outcome_reason="",
            spec=spec,
        ),
        **extra,  # type: ignore[arg-type]
    )


def write(engine: Engine, rec: AuditRecord) -> bool:
    with session_scope(engine) as session:
        return apply(session=session, record=rec, key=TEST_AUDIT_KEY)


def count(engine: Engine, table: type) -> int:
    with session_scope(engine) as session:
        return int(session.exec(select(func.count()).select_from(table)).one())  # type: ignore[call-overload]


def test_apply_twice_writes_once(store_engine: Engine) -> None:
    request = DecisionRequest(
        id="4-dispatch-1",
        ticket_id="4",
        kind=DecisionKind.DISPATCH,
        question="Dispatch?",
        options=["approve", "reject"],
        deciders=["wayne"],
        delegates=["lead"],
        requested_at=T0,
    )
    gate = GateResult(
        gate="decode",
        metric=Metric.DECODE_TPS,
        verdict=Verdict.PASS,
        reason="ok",
        rule="decode_tps >= 55",
        method="command",
        samples=[56.0, 56.1, 55.9],
        median=56.0,
        host="pc",
        commit="abc",
    )
    first = [
        record(1, kind=AuditKind.FILED, status="draft", spec={"id": "4"}),
        record(2, kind=AuditKind.DECISION_REQUESTED, status="awaiting_approval", decision_request=request),
        record(3, kind=AuditKind.GATE, status="gating", gate_results=[gate], attempt=1),
    ]
    assert [write(store_engine, r) for r in first] == [True, True, True]
    # A retried activity hands the same records in again, even with a later clock: nothing is written.
    again = [r.model_copy(update={"event": r.event.model_copy(update={"summary": "retry"})}) for r in first]
    assert [write(store_engine, r) for r in again] == [False, False, False]
    assert count(store_engine, AuditEventRow) == 3
    assert count(store_engine, DecisionRow) == 1
    assert count(store_engine, VerdictRow) == 1
    with session_scope(store_engine) as session:
        rows = queries.audit_events(session=session, ticket_id="4")
        [verdict] = queries.verdicts(session=session, ticket_id="4")
        [decision] = queries.decisions(session=session, ticket_id="4", pending=True)
    assert [r.summary for r in rows] == ["filed 1", "decision_requested 2", "gate 3"]
    assert verdict.samples == [56.0, 56.1, 55.9] and verdict.attempt == 1 and verdict.seq == 3
    assert decision.deciders == ["wayne", "lead"] and decision.decided_at is None


def write_all(engine: Engine, records: list[AuditRecord]) -> int:
    with session_scope(engine) as session:
        return apply_all(session=session, records=records, key=TEST_AUDIT_KEY)


def test_a_batch_is_written_once_whole_and_chained_in_order(store_engine: Engine) -> None:
    batch = [record(1, kind=AuditKind.FILED, status="draft", spec={"id": "4"}), record(2), record(3)]
    assert write_all(store_engine, batch) == 3
    assert write_all(store_engine, batch) == 0  # a retried batch
    with session_scope(store_engine) as session:
        rows = queries.audit_events(session=session, ticket_id="4")
        ticket = queries.get_ticket(session=session, ticket_id="4")
    assert [r.seq for r in rows] == [1, 2, 3]
    assert [r.prev_hash for r in rows[1:]] == [r.hash for r in rows[:-1]]
    assert ticket is not None and ticket.last_seq == 3 and ticket.spec == {"id": "4"}


def test_a_batch_partly_written_before_writes_the_rest(store_engine: Engine) -> None:
    """Should part of a batch be in the store already (written alone, by a retry that raced it), the batch writes
    each record on its own: the new ones once, the old ones not again."""
    assert write(store_engine, record(2))
    assert (
        write_all(store_engine, [record(1, kind=AuditKind.FILED, spec={"id": "4"}), record(2), record(3)])
        == 2
    )
    with session_scope(store_engine) as session:
        assert [r.seq for r in queries.audit_events(session=session, ticket_id="4")] == [1, 2, 3]


def test_the_same_seq_of_another_run_is_another_event(store_engine: Engine) -> None:
    assert write(store_engine, record(1, run_id="run-1"))
    assert write(store_engine, record(1, run_id="run-2"))
    assert count(store_engine, AuditEventRow) == 2


def test_a_decision_is_written_once_and_answers_its_request(store_engine: Engine) -> None:
    request = DecisionRequest(
        id="4-escalation-1",
        ticket_id="4",
        kind=DecisionKind.ESCALATION,
        question="What now?",
        options=["retry", "fail"],
        deciders=["wayne"],
        requested_at=T0,
    )
    write(
        store_engine,
        record(1, kind=AuditKind.DECISION_REQUESTED, status="awaiting_decision", decision_request=request),
    )
    decided = record(
        2,
        kind=AuditKind.DECIDED,
        actor="wayne",
        decision=Decision(request_id=request.id, option="fail", decided_by="wayne"),
    )
    assert write(store_engine, decided)
    late = decided.model_copy(
        update={"decision": Decision(request_id=request.id, option="retry", decided_by="wayne")}
    )
    assert not write(store_engine, late)  # the retried write of seq 2 cannot change the answer
    with session_scope(store_engine) as session:
        assert queries.decisions(session=session, pending=True) == []
        [row] = queries.decisions(session=session, ticket_id="4")
    assert (row.option, row.decided_by, row.decided_at) == ("fail", "wayne", decided.event.at)


def test_projection_follows_the_latest_event_and_a_refiled_ticket(store_engine: Engine) -> None:
    write(store_engine, record(1, status="draft", kind=AuditKind.FILED, spec={"id": "4", "v": 1}))
    write(store_engine, record(3, status="gating"))
    write(store_engine, record(2, status="building"))  # late, out of order: the projection keeps seq 3
    with session_scope(store_engine) as session:
        row = queries.get_ticket(session=session, ticket_id="4")
    assert row is not None and row.status == "gating" and row.spec == {"id": "4", "v": 1}
    assert row.filed_at == T0 + timedelta(minutes=1) and row.closed_at is None

    write(store_engine, record(4, status="cancelled"))
    with session_scope(store_engine) as session:
        row = queries.get_ticket(session=session, ticket_id="4")
    assert row is not None and row.status == "cancelled" and row.closed_at == T0 + timedelta(minutes=4)

    # Filed again under the same id: a new run, a new trail, and the projection follows it.
    refiled_at = T0 + timedelta(hours=1)
    write(
        store_engine,
        record(
            1,
            run_id="run-2",
            status="draft",
            kind=AuditKind.FILED,
            at=refiled_at,
            title="MTP align tax, take 2",
            spec={"id": "4", "v": 2},
        ),
    )
    with session_scope(store_engine) as session:
        row = queries.get_ticket(session=session, ticket_id="4")
        events = queries.audit_events(session=session, ticket_id="4")
    assert row is not None
    assert (row.run_id, row.status, row.title, row.spec) == (
        "run-2",
        "draft",
        "MTP align tax, take 2",
        {"id": "4", "v": 2},
    )
    assert row.filed_at == refiled_at and row.closed_at is None
    trails: dict[str, list[int]] = {}
    for event in events:
        trails.setdefault(event.run_id, []).append(event.seq)
    assert trails == {"run-1": [1, 2, 3, 4], "run-2": [1]}

    write(store_engine, record(2, run_id="run-2", status="passed", at=refiled_at + timedelta(minutes=1)))
    with session_scope(store_engine) as session:
        row = queries.get_ticket(session=session, ticket_id="4")
        [only] = queries.list_tickets(session=session)
        assert queries.list_tickets(session=session, status="cancelled") == []
    assert row is not None and row.status == "passed" and row.closed_at == refiled_at + timedelta(minutes=1)
    assert only.ticket_id == "4" and only.spec == {"id": "4", "v": 2}  # later events do not erase the spec


def test_a_late_event_of_an_earlier_filing_does_not_close_the_new_one(store_engine: Engine) -> None:
    write(store_engine, record(1, status="draft", kind=AuditKind.FILED))
    refiled_at = T0 + timedelta(hours=1)
    write(store_engine, record(1, run_id="run-2", status="draft", kind=AuditKind.FILED, at=refiled_at))
    write(store_engine, record(5, run_id="run-1", status="cancelled", at=T0 + timedelta(minutes=5)))
    with session_scope(store_engine) as session:
        row = queries.get_ticket(session=session, ticket_id="4")
    assert row is not None and (row.run_id, row.status) == ("run-2", "draft")
    assert row.closed_at is None


def test_audit_queries_by_ticket_actor_and_since(store_engine: Engine) -> None:
    write(store_engine, record(1, ticket_id="4", kind=AuditKind.FILED, actor="cli"))
    write(store_engine, record(2, ticket_id="4", kind=AuditKind.DECIDED, actor="wayne"))
    write(
        store_engine,
        record(
            1,
            ticket_id="5",
            run_id="run-5",
            kind=AuditKind.FILED,
            actor="lead",
            at=T0 + timedelta(minutes=30),
        ),
    )
    write(
        store_engine,
        record(
            2,
            ticket_id="5",
            run_id="run-5",
            kind=AuditKind.DELEGATED,
            actor="wayne",
            at=T0 + timedelta(minutes=31),
        ),
    )
    with session_scope(store_engine) as session:

        def seen(**filters: object) -> list[tuple[str, int]]:
            return [(e.ticket_id, e.seq) for e in queries.audit_events(session=session, **filters)]  # type: ignore[arg-type]

        assert seen() == [("4", 1), ("4", 2), ("5", 1), ("5", 2)]  # oldest first
        assert seen(ticket_id="5") == [("5", 1), ("5", 2)]
        assert seen(actor="wayne") == [("4", 2), ("5", 2)]
        assert seen(actor="Wayne") == [("4", 2), ("5", 2)]  # people are matched case-insensitively
        assert seen(since=T0 + timedelta(minutes=30)) == [("5", 1), ("5", 2)]  # inclusive
        assert seen(actor="wayne", since=T0 + timedelta(minutes=10)) == [("5", 2)]
        assert seen(ticket_id="4", actor="lead") == []
        assert seen(limit=3) == [("4", 1), ("4", 2), ("5", 1)]
        assert seen(ticket_id="6") == []


def test_a_failed_write_leaves_nothing_half_made(store_engine: Engine) -> None:
    """session_scope rolls the whole record back: no event without its projection, or the other way round."""
    rec = record(1, kind=AuditKind.FILED, spec={"id": "4"})
    try:
        with session_scope(store_engine) as session:
            apply(session=session, record=rec, key=TEST_AUDIT_KEY)
            raise RuntimeError("the activity died between apply and commit")
    except RuntimeError:
        pass
    assert count(store_engine, AuditEventRow) == 0 and count(store_engine, TicketRow) == 0
    assert write(store_engine, rec)  # the retry writes it, once
    assert count(store_engine, AuditEventRow) == 1 and count(store_engine, TicketRow) == 1


def test_closing_withdraws_the_requests_nobody_answered(store_engine: Engine) -> None:
    request = DecisionRequest(
        id="4-dispatch-1",
        ticket_id="4",
        kind=DecisionKind.DISPATCH,
        question="Dispatch ticket 4?",
        options=["approve", "reject"],
        deciders=["wayne"],
        requested_at=T0,
    )
    write(
        store_engine,
        record(
            1,
            status="awaiting_approval",
            kind=AuditKind.DECISION_REQUESTED,
            decision_request=request,
            detail={"request": request.id},  # as the desk writes it
        ),
    )
    with session_scope(store_engine) as session:
        assert [r.request_id for r in queries.decisions(session=session, pending=True)] == ["4-dispatch-1"]
    write(store_engine, record(2, status="cancelled", actor="wayne"))
    with session_scope(store_engine) as session:
        assert queries.decisions(session=session, pending=True) == []
        [row] = queries.decisions(session=session, ticket_id="4")
    assert row.option is None and row.note.startswith("withdrawn")


def test_closing_leaves_the_requests_of_a_ticket_whose_id_extends_it(store_engine: Engine) -> None:
    """Ticket 4 closing withdraws its own requests only: 4-fix's pending dispatch still waits for its answer
    (it was withdrawn by id prefix, and a decider listing pending requests never saw it again)."""
    for ticket_id in ("4", "4-fix"):
        request = DecisionRequest(
            id=f"{ticket_id}-dispatch-1",
            ticket_id=ticket_id,
            kind=DecisionKind.DISPATCH,
            question=f"Dispatch ticket {ticket_id}?",
            options=["approve", "reject"],
            deciders=["wayne"],
            requested_at=T0,
        )
        write(
            store_engine,
            record(
                1,
                ticket_id=ticket_id,
                run_id=f"run-{ticket_id}",
                status="awaiting_approval",
                kind=AuditKind.DECISION_REQUESTED,
                decision_request=request,
                detail={"request": request.id},
            ),
        )
    write(store_engine, record(2, status="cancelled", actor="wayne"))
    with session_scope(store_engine) as session:
        pending = [r.request_id for r in queries.decisions(session=session, pending=True)]
    assert pending == ["4-fix-dispatch-1"]
