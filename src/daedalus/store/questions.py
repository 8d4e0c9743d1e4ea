"""Read-side queries of questions and standing rulings (daedalus.decisions.questions), for services and the
report: a question's decision requests are `decisions` rows of kind `question`; a ruling is the `ruled` audit
event its answer wrote, the Ruling as JSON in its detail."""

from __future__ import annotations

from sqlmodel import Session, col, select

from daedalus.decisions.questions import RULING_DETAIL
from daedalus.decisions.rulings import Ruling, standing
from daedalus.decisions.schemas import DecisionKind
from daedalus.schemas.audit import AuditKind
from daedalus.store.tables import AuditEventRow, DecisionRow


def standing_rulings(session: Session) -> list[Ruling]:
    """The rulings that stand, oldest first: made (a question id is never asked twice, so neither is a
    ruling's), with a rule, and not lifted by a later ruling."""
    return standing(all_rulings(session))


def all_rulings(session: Session) -> list[Ruling]:
    """Every ruling made, oldest first, including those lifted since and those that only lift."""
    query = (
        select(AuditEventRow.detail)
        .where(AuditEventRow.kind == AuditKind.RULED.value)
        .order_by(col(AuditEventRow.at), col(AuditEventRow.id))
    )
    return [
        Ruling.model_validate_json(detail[RULING_DETAIL])
        for detail in session.exec(query)
        if detail.get(RULING_DETAIL)
    ]


def question_rows(session: Session, *, pending: bool = False) -> list[DecisionRow]:
    """The questions' decision requests, oldest first (open ones only with `pending`)."""
    query = (
        select(DecisionRow)
        .where(DecisionRow.kind == DecisionKind.QUESTION.value)
        .order_by(col(DecisionRow.requested_at))
    )
    if pending:
        query = query.where(col(DecisionRow.decided_at).is_(None))
    return list(session.exec(query))
