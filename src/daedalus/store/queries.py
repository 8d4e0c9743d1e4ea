"""Read-side queries for the CLI, the API and the report. Keyword-only, returning table rows."""

from collections.abc import Sequence
from datetime import datetime

from sqlmodel import Session, col, or_, select

from daedalus.store.tables import (
    AuditEventRow,
    CampaignCellRow,
    DecisionRow,
    LessonRow,
    TicketRow,
    VerdictRow,
)


def list_tickets(*, session: Session, status: str | None = None, limit: int = 200) -> Sequence[TicketRow]:
    query = select(TicketRow).order_by(col(TicketRow.updated_at).desc()).limit(limit)
    if status is not None:
        query = query.where(TicketRow.status == status)
    return session.exec(query).all()


def get_ticket(*, session: Session, ticket_id: str) -> TicketRow | None:
    return session.get(TicketRow, ticket_id)


def audit_events(
    *,
    session: Session,
    ticket_id: str | None = None,
    actor: str | None = None,
    since: datetime | None = None,
    limit: int = 1000,
) -> Sequence[AuditEventRow]:
    query = select(AuditEventRow).order_by(col(AuditEventRow.at), col(AuditEventRow.seq)).limit(limit)
    if ticket_id is not None:
        query = query.where(AuditEventRow.ticket_id == ticket_id)
    if actor is not None:
        query = query.where(AuditEventRow.actor == actor.lower())
    if since is not None:
        query = query.where(AuditEventRow.at >= since)
    return session.exec(query).all()


def verdicts(*, session: Session, ticket_id: str) -> Sequence[VerdictRow]:
    query = select(VerdictRow).where(VerdictRow.ticket_id == ticket_id)
    return session.exec(query.order_by(col(VerdictRow.recorded_at), col(VerdictRow.id))).all()


def verdict(*, session: Session, verdict_id: int) -> VerdictRow | None:
    return session.get(VerdictRow, verdict_id)


def decisions(
    *, session: Session, ticket_id: str | None = None, pending: bool = False
) -> Sequence[DecisionRow]:
    query = select(DecisionRow).order_by(col(DecisionRow.requested_at))
    if ticket_id is not None:
        query = query.where(DecisionRow.ticket_id == ticket_id)
    if pending:
        query = query.where(col(DecisionRow.decided_at).is_(None))
    return session.exec(query).all()


def requests_asked(*, session: Session, subjects: Sequence[str]) -> dict[str, int]:
    """Subject -> the highest request number its filings asked (`4-dispatch-3` is number 3)."""
    rows = session.exec(
        select(DecisionRow.ticket_id, DecisionRow.request_id).where(col(DecisionRow.ticket_id).in_(subjects))
    )
    asked: dict[str, int] = {}
    for subject, request_id in rows:
        number = request_id.rsplit("-", 1)[-1]
        if number.isdecimal():
            asked[subject] = max(asked.get(subject, 0), int(number))
    return asked


def decision_subject(*, session: Session, request_id: str) -> str | None:
    """The subject (JSON, as the desk wrote it) of the workflow that asked `request_id`; None if unknown.

    The desk writes the request id and its subject into the `decision_requested` event, so a decision finds
    its workflow without anyone parsing the request id.
    """
    detail = col(AuditEventRow.detail)
    query = select(detail).where(
        AuditEventRow.kind == "decision_requested", detail["request"].as_string() == request_id
    )
    found = session.exec(query).first()
    return found.get("subject") if found else None


def lessons(
    *,
    session: Session,
    engine: str | None = None,
    host: str | None = None,
    since: datetime | None = None,
    limit: int = 500,
) -> Sequence[LessonRow]:
    """Lessons oldest first; `engine` and `host` together give the lessons of either subject."""
    query = select(LessonRow).order_by(col(LessonRow.recorded_at), col(LessonRow.id))
    subjects = []
    if engine is not None:
        subjects.append((LessonRow.subject_kind == "engine") & (LessonRow.subject == engine))
    if host is not None:
        subjects.append((LessonRow.subject_kind == "host") & (LessonRow.subject == host))
    if subjects:
        query = query.where(or_(*subjects))
    if since is not None:
        query = query.where(LessonRow.recorded_at >= since)
    rows = session.exec(query).all()
    return rows[-limit:]


def campaign_cells(*, session: Session, campaign_id: str) -> Sequence[CampaignCellRow]:
    query = select(CampaignCellRow).where(CampaignCellRow.campaign_id == campaign_id)
    return session.exec(query.order_by(col(CampaignCellRow.id))).all()
