"""Apply audit records: the only way rows are written. Idempotent on (workflow id, sequence number).

The event, the ticket projection and the decision rows go in as Core statements on the session's connection
(one transaction with the rest): the ORM's unit of work, identity map and a load of the ticket row's spec were
most of a write's cost, and every decision waits for a few writes (in a burst of decisions, a close's withdrawal
of unanswered requests through the ORM alone held the control worker's GIL 6% of the time, py-spy). Verdicts,
rarer, go through the ORM."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, bindparam, insert, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from daedalus.schemas.audit import WITHDRAWS_REQUEST, AuditEvent, AuditKind, AuditRecord
from daedalus.schemas.ticket import TicketStatus
from daedalus.store import chain, seals
from daedalus.store.seals import AuditKey
from daedalus.store.tables import AuditEventRow, DecisionRow, TicketRow, VerdictRow

_EVENTS: Table = AuditEventRow.__table__  # type: ignore[attr-defined]
_TICKETS: Table = TicketRow.__table__  # type: ignore[attr-defined]
_DECISIONS: Table = DecisionRow.__table__  # type: ignore[attr-defined]
# Built once, with values passed at execution: SQLAlchemy compiles each once and reuses it.
INSERT_EVENT = insert(_EVENTS)
INSERT_TICKET = insert(_TICKETS)
TICKET_NOW = select(
    _TICKETS.c.run_id, _TICKETS.c.last_seq, _TICKETS.c.updated_at, _TICKETS.c.closed_at
).where(_TICKETS.c.ticket_id == bindparam("ticket"))
UPDATE_TICKET = update(_TICKETS).where(_TICKETS.c.ticket_id == bindparam("ticket"))
INSERT_DECISION = insert(_DECISIONS)
DECISION_EXISTS = select(_DECISIONS.c.request_id).where(_DECISIONS.c.request_id == bindparam("request"))
ANSWER_DECISION = update(_DECISIONS).where(_DECISIONS.c.request_id == bindparam("request"))
ASKED = select(_EVENTS.c.detail).where(
    _EVENTS.c.ticket_id == bindparam("subject"), _EVENTS.c.kind == AuditKind.DECISION_REQUESTED.value
)
WITHDRAW = (
    update(_DECISIONS)
    .where(
        _DECISIONS.c.request_id.in_(bindparam("requests", expanding=True)), _DECISIONS.c.decided_at.is_(None)
    )
    .values(note=bindparam("note"), decided_at=bindparam("at"))
)


def apply(*, session: Session, record: AuditRecord, key: AuditKey) -> bool:
    """Write the record's event, projection, decision and verdicts. False if it was already written.

    Written is the exception (a retried activity), so it is not asked first: the event's unique (run id, seq)
    refuses the second copy at its insert, and that refusal undoes the whole transaction."""
    try:
        _write(session, record, key)
    except IntegrityError:
        session.rollback()
        if _written(session, record.event):
            return False  # written before, or by a concurrent retry of the same activity that won the race
        raise
    return True


def apply_all(*, session: Session, records: Sequence[AuditRecord], key: AuditKey) -> int:
    """Write consecutive records of one trail in the session's transaction; how many were new.

    A batch commits whole or not at all, so a retried batch normally finds all of it written. Should any of it
    be (a retry, or a write that raced it), the batch is undone and each record applied and committed alone."""
    try:
        for record in records:
            _write(session, record, key)
    except IntegrityError:
        session.rollback()
        written = 0
        for record in records:
            written += apply(session=session, record=record, key=key)
            session.commit()
        return written
    return len(records)


def _write(session: Session, record: AuditRecord, key: AuditKey) -> None:
    """The event, chained to its trail, then what it decided (projection, decision, verdicts), then its seal over
    all of it (read back from this transaction, as `daedalus audit verify` will read it)."""
    event = record.event
    connection = session.connection()
    prev_hash = chain.last_hash(session, event.ticket_id)
    fields = event.model_dump()
    digest = chain.event_hash(prev_hash=prev_hash, **fields)
    connection.execute(INSERT_EVENT, {**fields, "prev_hash": prev_hash, "hash": digest})
    _project_ticket(connection, record)
    _record_decision(connection, record)
    if record.ticket is None and event.kind is AuditKind.CLOSED:
        _withdraw_pending(connection, event.ticket_id, event.at)
    if withdrawn := event.detail.get(WITHDRAWS_REQUEST):
        connection.execute(
            WITHDRAW, {"requests": [withdrawn], "at": event.at, "note": f"withdrawn: {event.summary}"}
        )
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
    session.flush()
    seals.seal_written(session, key, AuditEventRow(**fields, prev_hash=prev_hash, hash=digest))


def _written(session: Session, event: AuditEvent) -> bool:
    query = select(AuditEventRow.id).where(
        AuditEventRow.run_id == event.run_id, AuditEventRow.seq == event.seq
    )
    return session.exec(query).first() is not None


def _project_ticket(connection: Connection, record: AuditRecord) -> None:
    """Move the ticket's projection forward; an event older than what the row shows changes nothing."""
    snapshot = record.ticket
    if snapshot is None:
        return
    event = record.event
    key = {"ticket": snapshot.ticket_id}
    row = connection.execute(TICKET_NOW, key).first()
    values: dict[str, Any] = snapshot.model_dump(exclude={"spec"})
    values.update(updated_at=event.at, last_seq=event.seq)
    if snapshot.spec is not None:
        values["spec"] = snapshot.spec
    closed_at = None if row is None else row.closed_at
    if row is None:
        connection.execute(INSERT_TICKET, {"spec": {}, **values, "filed_at": event.at})
    elif row.run_id == snapshot.run_id:
        if event.seq < row.last_seq:
            return
        connection.execute(UPDATE_TICKET, {**key, **values})
    else:
        if event.at < row.updated_at:
            return  # a late event of an earlier filing of this ticket id
        # The ticket id was filed again after its earlier workflow closed: the projection follows the new filing.
        closed_at = None
        connection.execute(UPDATE_TICKET, {**key, **values, "filed_at": event.at, "closed_at": None})
    if TicketStatus(snapshot.status).is_closed and closed_at is None:
        connection.execute(UPDATE_TICKET, {**key, "closed_at": event.at})
        _withdraw_pending(connection, snapshot.ticket_id, event.at)


def _withdraw_pending(connection: Connection, subject: str, at: datetime) -> None:
    """A subject that closed answers nothing more: its unanswered requests stop counting as waiting.

    Its requests are the ones its own trail asked, never found by request id prefix: ticket `4` closing
    must leave ticket `4-fix`'s pending request (`4-fix-dispatch-1`) waiting."""
    asked = connection.execute(ASKED, {"subject": subject}).scalars()
    requests = [detail["request"] for detail in asked if "request" in detail]
    if requests:
        connection.execute(
            WITHDRAW, {"requests": requests, "at": at, "note": "withdrawn: closed without an answer"}
        )


def _record_decision(connection: Connection, record: AuditRecord) -> None:
    request = record.decision_request
    if request is not None and connection.execute(DECISION_EXISTS, {"request": request.id}).first() is None:
        connection.execute(
            INSERT_DECISION,
            {
                "request_id": request.id,
                "ticket_id": request.ticket_id,
                "kind": request.kind.value,
                "question": request.question,
                "options": request.options,
                "deciders": request.allowed,
                "requested_at": request.requested_at,
                "note": "",
            },
        )
    decision = record.decision
    if decision is not None:
        connection.execute(
            ANSWER_DECISION,
            {
                "request": decision.request_id,
                "option": decision.option,
                "decided_by": decision.decided_by,
                "channel": decision.channel.value,
                "note": decision.note,
                "decided_at": record.event.at,
            },
        )
