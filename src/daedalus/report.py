"""The progress report (the seed's "battle report"), rolled up from the store — never from Temporal history.

Status cards per ticket with its latest verdicts, the gate table, training runs and their deaths, and the
decisions waiting for someone; optionally opened by the lead agent's narrative over those facts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session, col, select

from daedalus.ids import TRAINING_PREFIX
from daedalus.store import queries
from daedalus.store.tables import AuditEventRow, DecisionRow, TicketRow, VerdictRow


@dataclass(frozen=True)
class TrainingSummary:
    run: str
    events: list[AuditEventRow]

    @property
    def deaths(self) -> list[AuditEventRow]:
        return [e for e in self.events if e.kind == "death"]

    @property
    def state(self) -> str:
        return self.events[-1].status if self.events else "unknown"


@dataclass
class Report:
    since: datetime
    tickets: list[TicketRow]
    verdicts: dict[str, list[VerdictRow]]
    pending: list[DecisionRow]
    training: list[TrainingSummary]
    narrative: list[str] = field(default_factory=list)
    narrative_note: str = ""

    def facts(self) -> list[str]:
        """One line per fact, the input of the lead agent's narrative."""
        lines = []
        for ticket in self.tickets:
            gates = ", ".join(
                f"{v.gate} {v.verdict} (median {v.median:.4g})"
                if v.median is not None
                else f"{v.gate} {v.verdict}"
                for v in latest_per_gate(self.verdicts.get(ticket.ticket_id, []))
            )
            lines.append(
                f"ticket {ticket.ticket_id} '{ticket.title}': {ticket.status}"
                + (f"; {gates}" if gates else "")
            )
        for run in self.training:
            lines.append(f"training {run.run}: {run.state}, {len(run.deaths)} deaths")
        for request in self.pending:
            lines.append(f"waiting for {', '.join(request.deciders)}: {request.question}")
        return lines

    def markdown(self) -> str:
        out = [f"# Progress report — since {self.since:%Y-%m-%d %H:%M} UTC", ""]
        if self.narrative:
            out += [*(f"> {line}" for line in self.narrative), ""]
            if self.narrative_note:
                out += [f"_{self.narrative_note}_", ""]
        out += [
            "## Status",
            "",
            "| ticket | title | status | attempts | latest verdicts |",
            "|---|---|---|---|---|",
        ]
        for ticket in self.tickets:
            verdicts = "; ".join(
                f"{v.gate}: {v.verdict}" + (f" {v.median:.4g}" if v.median is not None else "")
                for v in latest_per_gate(self.verdicts.get(ticket.ticket_id, []))
            )
            out.append(
                f"| {ticket.ticket_id} | {ticket.title} | {ticket.status} | {ticket.attempts} | {verdicts or '-'} |"
            )
        out += [
            "",
            "## Gates",
            "",
            "| ticket | attempt | gate | verdict | median | CI | rule | host | commit |",
        ]
        out.append("|---|---|---|---|---|---|---|---|---|")
        for ticket in self.tickets:
            for v in self.verdicts.get(ticket.ticket_id, []):
                interval = (
                    f"[{v.ci_low:.4g}, {v.ci_high:.4g}]"
                    if v.ci_low is not None and v.ci_high is not None
                    else "-"
                )
                median = f"{v.median:.4g}" if v.median is not None else "-"
                out.append(
                    f"| {v.ticket_id} | {v.attempt} | {v.gate} | {v.verdict} | {median} | {interval} | {v.rule} "
                    f"| {v.host or '-'} | {(v.commit or '-')[:10]} |"
                )
        if self.training:
            out += ["", "## Training runs", "", "| run | state | deaths | last death |", "|---|---|---|---|"]
            for run in self.training:
                last = run.deaths[-1].summary if run.deaths else "-"
                out.append(f"| {run.run} | {run.state} | {len(run.deaths)} | {last} |")
        out += ["", "## Waiting for a decision", ""]
        out += [
            f"- **{r.request_id}** ({', '.join(r.deciders)}): {r.question} — options {', '.join(r.options)}"
            for r in self.pending
        ] or ["- nothing"]
        return "\n".join(out) + "\n"


def latest_per_gate(rows: Sequence[VerdictRow]) -> list[VerdictRow]:
    latest: dict[str, VerdictRow] = {}
    for row in rows:
        latest[row.gate] = row
    return list(latest.values())


def build_report(*, session: Session, since: datetime) -> Report:
    """Everything that changed since `since`, and everything still waiting."""
    tickets = list(
        session.exec(
            select(TicketRow).where(TicketRow.updated_at >= since).order_by(col(TicketRow.ticket_id))
        )
    )
    verdicts: dict[str, list[VerdictRow]] = defaultdict(list)
    for ticket in tickets:
        verdicts[ticket.ticket_id] = list(queries.verdicts(session=session, ticket_id=ticket.ticket_id))
    training_events = session.exec(
        select(AuditEventRow)
        .where(col(AuditEventRow.ticket_id).startswith(TRAINING_PREFIX), AuditEventRow.at >= since)
        .order_by(col(AuditEventRow.at), col(AuditEventRow.seq))
    ).all()
    by_run: dict[str, list[AuditEventRow]] = defaultdict(list)
    for event in training_events:
        by_run[event.ticket_id.removeprefix(TRAINING_PREFIX)].append(event)
    return Report(
        since=since,
        tickets=tickets,
        verdicts=dict(verdicts),
        pending=list(queries.decisions(session=session, pending=True)),
        training=[TrainingSummary(run, events) for run, events in sorted(by_run.items())],
    )
