"""Gather the report's facts from the store (never from Temporal history) into the report's model."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from sqlmodel import Session, col, select

from daedalus.decisions.schemas import DecisionKind
from daedalus.ids import TRAINING_PREFIX
from daedalus.report.i18n import _, language, ngettext, word
from daedalus.report.model import (
    CampaignView,
    Card,
    CurvePoint,
    DeathView,
    GateView,
    Report,
    TicketView,
    TrainingView,
    fmt,
)
from daedalus.report.questions import gather_questions
from daedalus.schemas.audit import AuditKind
from daedalus.schemas.ticket import TicketStatus
from daedalus.schemas.training import GIB
from daedalus.store import queries
from daedalus.store.tables import AuditEventRow, CampaignRow, DecisionRow, TicketRow, VerdictRow
from daedalus.training.curve import read_curve

MAX_CURVE_POINTS = 600
TONES: dict[str, str] = {
    TicketStatus.PASSED: "pass",
    TicketStatus.CLOSED_UNDER_EXCEPTION: "pass",
    TicketStatus.FAILED: "fail",
    TicketStatus.STOPPED_BY_RULES: "fail",
    TicketStatus.CANCELLED: "fail",
}


def build_report(
    *,
    session: Session,
    since: datetime,
    now: datetime | None = None,
    waiting_on_hosts: Mapping[str, str] | None = None,
    lang: str = "en",
) -> Report:
    """Everything that changed since `since`, and everything still waiting; `waiting_on_hosts` (ticket id ->
    line, from hosts.status.waiting_on_hosts) says which tickets are stuck on a host no worker polls. `lang`:
    the report's language (report/i18n.py LANGUAGES; UnknownLanguage for another)."""
    with language(lang):
        return _build(session, since, now, waiting_on_hosts, lang)


def _build(
    session: Session,
    since: datetime,
    now: datetime | None,
    waiting_on_hosts: Mapping[str, str] | None,
    lang: str,
) -> Report:
    now = now or datetime.now(UTC)
    tickets = list(
        session.exec(
            select(TicketRow).where(TicketRow.updated_at >= since).order_by(col(TicketRow.ticket_id))
        )
    )
    views = {t.ticket_id: _ticket_view(session, t) for t in tickets}
    roots: list[TicketView] = []
    for ticket in tickets:
        parent = views.get(ticket.parent) if ticket.parent else None
        (parent.children if parent is not None else roots).append(views[ticket.ticket_id])
    training = _training(session, since)
    campaigns = [
        CampaignView(row, list(queries.campaign_cells(session=session, campaign_id=row.campaign_id)))
        for row in session.exec(
            select(CampaignRow).where(CampaignRow.updated_at >= since).order_by(col(CampaignRow.started_at))
        )
    ]
    # questions that belong to no ticket have their own section (report/questions.py)
    pending = [r for r in queries.decisions(session=session, pending=True) if r.kind != DecisionKind.QUESTION]
    decided = list(
        session.exec(
            select(DecisionRow)
            .where(col(DecisionRow.decided_at) >= since, col(DecisionRow.option).is_not(None))
            .where(DecisionRow.kind != DecisionKind.QUESTION.value)
            .order_by(col(DecisionRow.decided_at))
        )
    )
    lessons = list(queries.lessons(session=session, since=since))
    return Report(
        since=since,
        generated_at=now,
        cards=_cards(roots, training, campaigns, pending),
        tickets=roots,
        training=training,
        campaigns=campaigns,
        pending=pending,
        decided=decided,
        lessons=lessons,
        waiting_on_hosts=dict(waiting_on_hosts or {}),
        questions=gather_questions(session, since),
        lang=lang,
    )


def _ticket_view(session: Session, ticket: TicketRow) -> TicketView:
    by_gate: dict[str, list[VerdictRow]] = defaultdict(list)
    for verdict in queries.verdicts(session=session, ticket_id=ticket.ticket_id):
        by_gate[verdict.gate].append(verdict)
    gates = [GateView(latest=rows[-1], history=rows) for rows in by_gate.values()]
    return TicketView(
        row=ticket,
        gates=gates,
        decisions=list(queries.decisions(session=session, ticket_id=ticket.ticket_id)),
    )


def _training(session: Session, since: datetime) -> list[TrainingView]:
    events = session.exec(
        select(AuditEventRow)
        .where(col(AuditEventRow.ticket_id).startswith(TRAINING_PREFIX), AuditEventRow.at >= since)
        .order_by(col(AuditEventRow.at), col(AuditEventRow.seq))
    ).all()
    by_run: dict[str, list[AuditEventRow]] = defaultdict(list)
    for event in events:
        by_run[event.ticket_id.removeprefix(TRAINING_PREFIX)].append(event)
    return [
        TrainingView(run, rows, [_death(e) for e in rows if e.kind == AuditKind.DEATH.value])
        for run, rows in sorted(by_run.items())
    ]


def _death(event: AuditEventRow) -> DeathView:
    """The death with its memory curve, read from the artifact the watchdog kept (when this machine has it)."""
    path_text = event.detail.get("curve")
    if not path_text:
        return DeathView(event, [], _("no memory curve was recorded"))
    path = Path(path_text)
    if not path.is_file():
        return DeathView(
            event, [], _("memory curve at {path} (on host; not readable here)").format(path=path)
        )
    samples = list(read_curve(path))
    if not samples:
        return DeathView(event, [], _("memory curve at {path} is empty").format(path=path))
    step = max(1, len(samples) // MAX_CURVE_POINTS)
    t0 = samples[0].t
    curve = [CurvePoint((s.t - t0) / 60, s.available / GIB) for s in samples[::step]]
    return DeathView(event, curve, _("{count} samples from {path}").format(count=len(samples), path=path))


def _cards(
    tickets: list[TicketView],
    training: list[TrainingView],
    campaigns: list[CampaignView],
    pending: list[DecisionRow],
) -> list[Card]:
    cards = []
    for view in tickets:
        tone = TONES.get(view.row.status, "wait" if view.row.awaiting else "info")
        subject = _("Ticket {ticket}: {title}").format(ticket=view.row.ticket_id, title=view.row.title)
        cards.append(Card(subject, view.headline, tone))
    for run in training:
        slope = _(", slope {slope} GiB/h").format(slope=fmt(run.slope, 3)) if run.slope is not None else ""
        deaths = len(run.deaths)
        progress = f"; {run.progress[0]}" if run.progress is not None else ""
        deployed = [e for e in run.deployments if e.detail.get("outcome") == "deployed"]
        serving = (
            _("; serving {checkpoint}").format(checkpoint=Path(deployed[-1].detail["checkpoint"]).name)
            if deployed
            else ""
        )
        cards.append(
            Card(
                _("Training {run}").format(run=run.run),
                word(run.state).replace("_", " ")
                + _(", ")
                + ngettext("{count} death", "{count} deaths", deaths).format(count=deaths)
                + f"{slope}{progress}{serving}",
                "fail" if run.state in ("gave_up", "awaiting_decision") else "info",
            )
        )
    for campaign in campaigns:
        row = campaign.row
        cards.append(
            Card(
                _("Campaign {campaign}: {title}").format(campaign=row.campaign_id, title=row.title),
                _("{status}; {cells} cells, {crashed} crashed; proposes {proposal}").format(
                    status=word(row.status),
                    cells=len(campaign.cells),
                    crashed=len(campaign.crashed),
                    proposal=row.proposal or _("nothing"),
                ),
                "wait" if row.status == "awaiting_decision" else "info",
            )
        )
    if pending:
        people = sorted({p for r in pending for p in r.deciders})
        cards.append(
            Card(
                _("Decisions waiting"),
                _("{count} for {people}").format(count=len(pending), people=", ".join(people)),
                "wait",
            )
        )
    return cards
