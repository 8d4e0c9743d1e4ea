"""The report's "Questions for <deciders>" and "Standing rulings" sections (the seed's section 6, "awaiting
Wayne's decisions", and the rulings its tables obey), from the store: each question's decision request
(`decisions`, kind `question`) and its trail (`audit_events` under `question:<id>`: the deadline when asked, the
outcome when closed); the rulings are the trails' `ruled` events.

Open questions are listed with their options, deciders and deadline; questions closed in the window as "done:
..." (ruled, answered, expired with the recorded outcome, or withdrawn); every standing ruling with who ruled
and when, whatever the window, because a ruling binds until changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session, col, select

from daedalus.decisions.rulings import Ruling, describe
from daedalus.ids import QUESTION_SUBJECT
from daedalus.report.i18n import _
from daedalus.report.parts import Part, Section, cell
from daedalus.schemas.audit import AuditKind
from daedalus.store.questions import all_rulings, question_rows, standing_rulings
from daedalus.store.tables import AuditEventRow, DecisionRow


@dataclass(frozen=True)
class QuestionLine:
    request_id: str
    question_id: str
    question: str
    options: list[str]
    deciders: list[str]
    asked_at: datetime
    deadline: str
    state: str = "open"
    outcome: str | None = None
    decided_by: str | None = None
    closed_at: datetime | None = None
    note: str = ""


@dataclass
class QuestionsView:
    open: list[QuestionLine] = field(default_factory=list)
    done: list[QuestionLine] = field(default_factory=list)
    rulings: list[Ruling] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.open or self.done or self.rulings)


def gather_questions(session: Session, since: datetime) -> QuestionsView:
    rows = question_rows(session)
    subjects = [row.ticket_id for row in rows]
    trail: dict[str, dict[str, AuditEventRow]] = {}
    if subjects:
        query = (
            select(AuditEventRow)
            .where(
                col(AuditEventRow.ticket_id).in_(subjects),
                col(AuditEventRow.kind).in_([AuditKind.FILED.value, AuditKind.CLOSED.value]),
            )
            .order_by(col(AuditEventRow.id))
        )
        for event in session.exec(query):
            trail.setdefault(event.ticket_id, {})[event.kind] = event
    view = QuestionsView(rulings=standing_rulings(session))
    ruled = {ruling.id for ruling in all_rulings(session)}
    for row in rows:
        line = _line(row, trail.get(row.ticket_id, {}), ruled)
        if row.decided_at is None:
            view.open.append(line)
        elif line.closed_at is not None and line.closed_at >= since:
            view.done.append(line)
    return view


def _line(row: DecisionRow, events: dict[str, AuditEventRow], ruled: set[str]) -> QuestionLine:
    question_id = row.ticket_id.removeprefix(QUESTION_SUBJECT)
    filed, closed = events.get(AuditKind.FILED.value), events.get(AuditKind.CLOSED.value)
    deadline = filed.detail.get("deadline", "") if filed is not None else ""
    outcome: str | None
    if row.option is not None:
        state = "ruled" if question_id in ruled and closed is not None else "answered"
        outcome, by = row.option, row.decided_by
    elif closed is not None and closed.detail.get("expired"):
        state, outcome, by = "expired", closed.detail.get("outcome"), None
    else:
        state, outcome, by = ("withdrawn" if row.decided_at is not None else "open"), None, None
    return QuestionLine(
        request_id=row.request_id,
        question_id=question_id,
        question=row.question,
        options=list(row.options),
        deciders=list(row.deciders),
        asked_at=row.requested_at,
        deadline=deadline[:16].replace("T", " "),
        state=state,
        outcome=outcome,
        decided_by=by,
        closed_at=row.decided_at,
        note=_note(state, row, closed),
    )


def _note(state: str, row: DecisionRow, closed: AuditEventRow | None) -> str:
    """The decider's note; for a withdrawn question who withdrew it and why (its close)."""
    if state == "withdrawn" and closed is not None and "withdrawn" in closed.detail:
        return _("by {who}: {why}").format(who=closed.actor, why=closed.detail["withdrawn"])
    return row.note if state in ("ruled", "answered") else ""


def questions_sections(view: QuestionsView) -> list[Section]:
    """The two sections, or none when no question was ever asked."""
    if view.empty:
        return []
    deciders = sorted({person for line in view.open for person in line.deciders})
    title = (
        _("Questions for {deciders}").format(deciders=", ".join(deciders))
        if deciders
        else _("Questions for the deciders")
    )
    lines = [
        f"- **{cell(q.question)}** — "
        + _("options {options}; answer with {command} by {deadline} UTC (asked {asked})").format(
            options=cell(", ".join(q.options)),
            command=f"`daedalus decide {cell(q.request_id)} <option>`",
            deadline=cell(q.deadline or "-"),
            asked=f"{q.asked_at:%Y-%m-%d}",
        )
        for q in view.open
    ] or ["- " + _("nothing waits")]
    for q in view.done:
        match q.state:
            case "ruled":
                done = _("ruled **{outcome}** by {who}").format(
                    outcome=cell(q.outcome), who=cell(q.decided_by)
                )
            case "answered":
                done = _("**{outcome}** by {who}").format(outcome=cell(q.outcome), who=cell(q.decided_by))
            case "expired":
                done = (
                    _("expired at the deadline, recorded **{outcome}**").format(outcome=cell(q.outcome))
                    if q.outcome
                    else _("expired unanswered")
                )
            case _:
                done = _("withdrawn {note}").format(note=cell(q.note)) if q.note else _("withdrawn")
        when = (
            _(" on {at}").format(at=f"{q.closed_at:%Y-%m-%d %H:%M}")
            if q.closed_at is not None and q.state != "withdrawn"
            else ""
        )
        note = f" — “{cell(q.note)}”" if q.note and q.state in ("ruled", "answered") else ""
        lines.append(f"- {cell(q.question)} — " + _("done: {done}").format(done=done) + f"{when}{note}")
    sections = [Section("questions", title, [Part("\n".join(lines))])]
    if view.rulings:
        header = [_("ruling"), _("rule"), _("ruled by"), _("when")]
        table = ["| " + " | ".join(header) + " |", "|---|---|---|---|"]
        table += [
            f"| {cell(r.statement)} | {cell(describe(r))} | {cell(r.ruled_by)} | {r.ruled_at:%Y-%m-%d %H:%M} |"
            for r in view.rulings
        ]
        table += [
            "",
            _(
                "Later tickets and campaign proposals that contradict a standing ruling are refused with its name."
            ),
        ]
        sections.append(Section("rulings", _("Standing rulings"), [Part("\n".join(table))]))
    return sections
