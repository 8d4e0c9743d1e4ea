"""The report's model: what the store says, arranged the way the team reads it. No I/O, no rendering."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from statistics import median
from typing import TYPE_CHECKING

from daedalus.report.i18n import DEFAULT, _, word
from daedalus.schemas.audit import AuditKind

if TYPE_CHECKING:
    from daedalus.report.questions import QuestionsView
from daedalus.store.tables import (
    AuditEventRow,
    CampaignCellRow,
    CampaignRow,
    DecisionRow,
    LessonRow,
    TicketRow,
    VerdictRow,
)

UNITS = {
    "decode_tps": "tok/s",
    "prefill_tps": "tok/s",
    "ttft_ms": "ms",
    "tpot_ms": "ms",
    "kib_per_token": "KiB/token",
    "compression": "x",
    "kv_pool_tokens": "tokens",
    "ppl_delta_pct": "%",
    "concurrent_users": "users",
}
_THRESHOLD = re.compile(r"(>=|<=)\s*(-?[0-9][0-9.eE+-]*)")


def threshold_of(rule: str) -> tuple[str, float] | None:
    """The comparator and threshold a verdict's rule names ("decode_tps >= 55" -> (">=", 55.0))."""
    match = _THRESHOLD.search(rule)
    if match is None:
        return None
    try:
        return match.group(1), float(match.group(2))
    except ValueError:
        return None


def fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


@dataclass(frozen=True)
class Card:
    """One headline card, as at the top of the seed: a subject and its state in a few words."""

    subject: str
    state: str
    tone: str  # pass | fail | wait | info


@dataclass(frozen=True)
class GateView:
    """A gate's latest verdict with what came before it: before/after figures and the raw rounds."""

    latest: VerdictRow
    history: list[VerdictRow]

    @property
    def unit(self) -> str:
        return UNITS.get(self.latest.metric, "")

    @property
    def before(self) -> float | None:
        """A/B: the baseline's median; otherwise the first attempt's median when there were several."""
        if self.latest.baseline_samples:
            return median(self.latest.baseline_samples)
        first = self.history[0]
        return first.median if first is not self.latest else None

    @property
    def after(self) -> float | None:
        if self.latest.baseline_samples and self.latest.samples:
            return median(self.latest.samples)
        return self.latest.median

    @property
    def provenance(self) -> str:
        v = self.latest
        return _("host {host}, commit {commit}, attempt {attempt}, {method}").format(
            host=v.host or "-", commit=(v.commit or "-")[:10], attempt=v.attempt, method=v.method
        )


@dataclass
class TicketView:
    row: TicketRow
    gates: list[GateView]
    decisions: list[DecisionRow]
    children: list[TicketView] = field(default_factory=list)

    @property
    def headline(self) -> str:
        """The ticket's state in a few words: its status and its first gate's figure."""
        status = word(self.row.status).replace("_", " ")
        if not self.gates:
            return status
        g = self.gates[0]
        figure = f" {fmt(g.after)} {g.unit}".rstrip() if g.after is not None else ""
        return _("{status}; {gate} {verdict}{figure}").format(
            status=status, gate=g.latest.gate, verdict=word(g.latest.verdict), figure=figure
        )


@dataclass(frozen=True)
class CurvePoint:
    minutes: float
    available_gib: float


@dataclass
class DeathView:
    event: AuditEventRow
    curve: list[CurvePoint]
    curve_note: str

    @property
    def death_id(self) -> str:
        return self.event.detail.get("death_id", f"#{self.event.seq}")

    @property
    def death_class(self) -> str:
        return self.event.detail.get("class", "-")

    @property
    def slope(self) -> float | None:
        text = self.event.detail.get("slope_gib_per_h")
        try:
            return float(text) if text not in (None, "", "None") else None
        except ValueError:
            return None


@dataclass
class TrainingView:
    run: str
    events: list[AuditEventRow]
    deaths: list[DeathView]

    @property
    def state(self) -> str:
        return self.events[-1].status if self.events else "unknown"

    @property
    def slope(self) -> float | None:
        """The fitted leak slope of the latest death that has one (GiB/h)."""
        for death in reversed(self.deaths):
            if death.slope is not None:
                return death.slope
        return None

    @property
    def progress(self) -> tuple[str, AuditEventRow] | None:
        """The trainer's latest progress the trail carries (a death's, or an evaluation's), with its event."""
        for event in reversed(self.events):
            summary = event.detail.get("progress") or event.detail.get("trainer_progress")
            if summary:
                return summary, event
        return None

    @property
    def evaluations(self) -> list[AuditEventRow]:
        return [e for e in self.events if e.kind == AuditKind.EVALUATION.value]

    @property
    def deployments(self) -> list[AuditEventRow]:
        return [e for e in self.events if e.kind == AuditKind.DEPLOYMENT.value]


@dataclass
class CampaignView:
    row: CampaignRow
    cells: list[CampaignCellRow]

    @property
    def crashed(self) -> list[CampaignCellRow]:
        return [c for c in self.cells if c.outcome == "crashed"]

    def columns(self) -> list[str]:
        """Workload columns (everything but the KV type), in the order measured."""
        seen: dict[str, None] = {}
        for cell in self.cells:
            seen.setdefault(workload_label(cell), None)
        return list(seen)

    def rows(self) -> list[str]:
        seen: dict[str, None] = {}
        for cell in self.cells:
            seen.setdefault(cell.label, None)
        return list(seen)

    def cell(self, label: str, column: str) -> CampaignCellRow | None:
        for cell in self.cells:
            if cell.label == label and workload_label(cell) == column:
                return cell
        return None


def workload_label(cell: CampaignCellRow) -> str:
    parts = [f"{k} {v}" for k, v in cell.axes.items() if k != "kv"]
    return ", ".join(parts)


@dataclass
class Report:
    since: datetime
    generated_at: datetime
    cards: list[Card]
    tickets: list[TicketView]
    training: list[TrainingView]
    campaigns: list[CampaignView]
    pending: list[DecisionRow]
    decided: list[DecisionRow]
    lessons: list[LessonRow]
    narrative: list[str] = field(default_factory=list)
    narrative_note: str = ""
    waiting_on_hosts: dict[str, str] = field(default_factory=dict)
    """Ticket id -> line, for every ticket stuck on a host no worker polls: also those unchanged in the window."""
    questions: QuestionsView | None = None
    """Questions that belong to no ticket and the standing rulings (report/questions.py)."""
    lang: str = DEFAULT
    """The language the report is written in (report/i18n.py): its cards are, and render writes the rest in it."""

    def all_tickets(self) -> list[TicketView]:
        out: list[TicketView] = []

        def walk(views: Sequence[TicketView]) -> None:
            for view in views:
                out.append(view)
                walk(view.children)

        walk(self.tickets)
        return out

    def facts(self) -> list[str]:
        """One line per fact, the only input of the lead agent's narrative (which may add none)."""
        lines = []
        for view in self.all_tickets():
            ticket = view.row
            gates = ", ".join(
                f"{g.latest.gate} {g.latest.verdict} (median {g.latest.median:.4g})"
                if g.latest.median is not None
                else f"{g.latest.gate} {g.latest.verdict}"
                for g in view.gates
            )
            lines.append(
                f"ticket {ticket.ticket_id} '{ticket.title}': {ticket.status}"
                + (f"; {gates}" if gates else "")
                + (f"; {stuck}" if (stuck := self.waiting_on_hosts.get(ticket.ticket_id)) else "")
            )
        for run in self.training:
            lines.append(f"training {run.run}: {run.state}, {len(run.deaths)} deaths")
        for campaign in self.campaigns:
            lines.append(
                f"campaign {campaign.row.campaign_id}: {campaign.row.status}, {len(campaign.cells)} cells, "
                f"{len(campaign.crashed)} crashed, proposes {campaign.row.proposal or 'nothing'}"
            )
        for request in self.pending:
            lines.append(f"waiting for {', '.join(request.deciders)}: {request.question}")
        for request in self.decided:
            lines.append(f"decided by {request.decided_by}: {request.question} -> {request.option}")
        return lines
