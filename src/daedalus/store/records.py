"""Apply audit records: the only way rows are written. Idempotent on (workflow id, sequence number)."""

from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord
from daedalus.schemas.ticket import TicketStatus
from daedalus.store import chain
from daedalus.store.tables import AuditEventRow, DecisionRow, TicketRow, VerdictRow


def apply(*, session: Session, record: AuditRecord) -> bool:
    """Write the record's event, projection, decision and verdicts. False if it was already written.

    Written is the exception (a retried activity), so it is not asked first: the event's unique (run id, seq)
    refuses the second copy, and that refusal, at the first flush, undoes the whole transaction."""
    try:
        _write(session, record)
        session.flush()
    except IntegrityError:
        session.rollback()
        if _written(session, record.event):
            return False  # written before, or by a concurrent retry of the same activity that won the race
        raise
    return True


def _write(session: Session, record: AuditRecord) -> None:
    event = record.event
    prev_hash = chain.last_hash(session, event.ticket_id)
    fields = event.model_dump()
    session.add(
        AuditEventRow(**fields, prev_hash=prev_hash, hash=chain.event_hash(prev_hash=prev_hash, **fields))
    )
    _project_ticket(session, record)
    _record_decision(session, record)
    if record.ticket is None and event.kind is AuditKind.CLOSED:
        _withdraw_pending(session, event.ticket_id, event.at)
    for result in record.gate_results:
        session.add(
            VerdictRow(
                workflow_id=event.workflow_id,
                run_id=event.run_id,
                seq=event.seq,
                ticket_id=event.ticket_id,
                attempt=record.attempt,
                recorded_at=event.at,
                **result.model_dump(mode="json", exclude={"metric", "verdict"}),
                metric=result.metric.value,
                verdict=result.verdict.value,
            )
        )


def _written(session: Session, event: AuditEvent) -> bool:
    query = select(AuditEventRow.id).where(
        AuditEventRow.run_id == event.run_id, AuditEventRow.seq == event.seq
    )
    return session.exec(query).first() is not None


def _project_ticket(session: Session, record: AuditRecord) -> None:
    """Move the ticket's projection forward; an event older than what the row shows changes nothing."""
    snapshot = record.ticket
    if snapshot is None:
        return
    event = record.event
    row = session.get(TicketRow, snapshot.ticket_id)
    values = snapshot.model_dump(exclude={"spec"})
    if row is None:
        row = TicketRow(
            **values, spec=snapshot.spec or {}, filed_at=event.at, updated_at=event.at, last_seq=event.seq
        )
        session.add(row)
    elif row.run_id == snapshot.run_id:
        if event.seq < row.last_seq:
            return
        _update(row, values, snapshot.spec, event.at, event.seq)
    else:
        if event.at < row.updated_at:
            return  # a late event of an earlier filing of this ticket id
        # The ticket id was filed again after its earlier workflow closed: the projection follows the new filing.
        row.filed_at, row.closed_at = event.at, None
        _update(row, values, snapshot.spec, event.at, event.seq)
    if TicketStatus(snapshot.status).is_closed and row.closed_at is None:
        row.closed_at = event.at
        _withdraw_pending(session, snapshot.ticket_id, event.at)


def _update(
    row: TicketRow, values: dict[str, object], spec: dict[str, object] | None, at: datetime, seq: int
) -> None:
    for key, value in values.items():
        setattr(row, key, value)
    if spec is not None:
        row.spec = spec
    row.updated_at, row.last_seq = at, seq


def _withdraw_pending(session: Session, subject: str, at: datetime) -> None:
    """A subject that closed answers nothing more: its unanswered requests stop counting as waiting.

    Its requests are the ones its own trail asked, never found by request id prefix: ticket `4` closing
    must leave ticket `4-fix`'s pending request (`4-fix-dispatch-1`) waiting."""
    asked = select(AuditEventRow.detail).where(
        AuditEventRow.ticket_id == subject, AuditEventRow.kind == AuditKind.DECISION_REQUESTED.value
    )
    request_ids = [detail["request"] for detail in session.exec(asked) if "request" in detail]
    query = select(DecisionRow).where(
        col(DecisionRow.request_id).in_(request_ids), col(DecisionRow.decided_at).is_(None)
    )
    for row in session.exec(query):
        row.note, row.decided_at = "withdrawn: closed without an answer", at


def _record_decision(session: Session, record: AuditRecord) -> None:
    if record.decision_request is not None:
        request = record.decision_request
        if session.get(DecisionRow, request.id) is None:
            session.add(
                DecisionRow(
                    request_id=request.id,
                    ticket_id=request.ticket_id,
                    kind=request.kind.value,
                    question=request.question,
                    options=request.options,
                    deciders=request.allowed,
                    requested_at=request.requested_at,
                )
            )
    if record.decision is not None:
        decision = record.decision
        row = session.get(DecisionRow, decision.request_id)
        if row is not None:
            row.option = decision.option
            row.decided_by = decision.decided_by
            row.channel = decision.channel
            row.note = decision.note
            row.decided_at = record.event.at
