"""What the console shows, gathered from the store and Temporal: the decisions waiting, a ticket with its evidence.

Read-only: every change goes through routes.py to the service layer. A ticket's live state comes from Temporal
(the `status` query, or a closed ticket's result), its verdicts, trail and sub-tickets' statuses from the store.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from daedalus.api.context import ApiContext
from daedalus.api.models import AuditEventPublic, DecisionPublic, TicketSummary, VerdictPublic
from daedalus.api.tickets import live_state
from daedalus.decisions.authority import refusal
from daedalus.decisions.schemas import Decision, DecisionKind, DecisionRequest
from daedalus.errors import RequestRefused
from daedalus.schemas.ticket import AttemptSummary, TicketSpec, TicketState
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.ticket_rules import tree_commands


@dataclass
class QueueEntry:
    """One pending decision request, as the queue lists it."""

    row: DecisionPublic
    mine: bool
    request: DecisionRequest | None = None
    """The request as its ticket holds it now (evidence, who may answer); None for training runs and campaigns,
    and when Temporal did not answer in time."""
    state: TicketState | None = None
    title: str = ""
    why_not: str | None = None
    """Why the signed-in person may not answer it (None: they may)."""

    @property
    def allowed(self) -> list[str]:
        return self.request.allowed if self.request is not None else self.row.deciders


@dataclass
class GateRow:
    """One gate across the attempts: its rule, then each attempt's verdict and interval (None: not measured)."""

    gate: str
    rule: str
    cells: list[VerdictCell | None]


@dataclass
class VerdictCell:
    verdict: str
    median: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float
    unit: str
    reason: str
    host_load: str | None = None
    """The host's load while the rounds ran (gates/contention.py); None where none was recorded."""

    @property
    def interval(self) -> str:
        if self.ci_low is None or self.ci_high is None:
            return ""
        return f"[{self.ci_low:.4g}, {self.ci_high:.4g}]"


@dataclass
class AttemptsSideBySide:
    attempts: list[AttemptSummary]
    gates: list[GateRow]


@dataclass
class TicketPage:
    ticket_id: str
    projection: TicketSummary | None
    live: TicketState | None
    spec: TicketSpec | None
    commands: list[str]
    children: list[tuple[str, str]]
    verdicts: list[VerdictPublic]
    side_by_side: AttemptsSideBySide
    pending: DecisionRequest | None
    why_not: str | None
    may_act: bool
    events: list[AuditEventPublic] = field(default_factory=list)

    @property
    def title(self) -> str:
        if self.spec is not None:
            return self.spec.title
        return self.projection.title if self.projection is not None else ""

    @property
    def status(self) -> str:
        if self.live is not None:
            return self.live.status.value
        return self.projection.status if self.projection is not None else "unknown"

    @property
    def closed(self) -> bool:
        return (
            self.live.status.is_closed
            if self.live is not None
            else self.projection is None or (self.projection.closed_at is not None)
        )


def side_by_side(attempts: list[AttemptSummary]) -> AttemptsSideBySide:
    """Each gate one row, each attempt one column: the decider compares verdicts and intervals at a glance."""
    gates: dict[str, GateRow] = {}
    for column, attempt in enumerate(attempts):
        for result in attempt.gate_results:
            row = gates.setdefault(result.gate, GateRow(result.gate, result.rule, [None] * len(attempts)))
            row.cells[column] = VerdictCell(
                verdict=result.verdict.value,
                median=result.median,
                ci_low=result.ci_low,
                ci_high=result.ci_high,
                confidence=result.confidence,
                unit=result.unit,
                reason=result.reason,
                host_load=result.host_load,
            )
    return AttemptsSideBySide(attempts=attempts, gates=list(gates.values()))


def why_not(request: DecisionRequest, person: str, context: ApiContext) -> str | None:
    """Why `person` may not answer `request`, by the request's own rules and the server's policy (the checks
    the service layer and the workflow's validator make when they answer)."""
    probe = Decision(request_id=request.id, option=request.options[0], decided_by=person)
    return refusal(request, probe, context.policy)


async def queue(context: ApiContext, person: str) -> list[QueueEntry]:
    """Every pending decision, the signed-in person's first, each ticket's with its request as asked now."""

    def read() -> tuple[list[DecisionPublic], dict[str, str]]:
        with session_scope(context.engine) as session:
            rows = [
                DecisionPublic.model_validate(r) for r in queries.decisions(session=session, pending=True)
            ]
            titles = {t.ticket_id: t.title for t in queries.list_tickets(session=session, limit=1000)}
        return rows, titles

    rows, titles = await asyncio.to_thread(read)
    client = await context.client()
    timeout_s = context.settings.update_timeout_s

    async def one(row: DecisionPublic) -> QueueEntry:
        waiting = QueueEntry(row=row, mine=person in row.deciders, title=titles.get(row.ticket_id, ""))
        if row.ticket_id not in titles:
            return waiting  # a training run's or a campaign's: answered by request id alone
        try:
            state = await live_state(client, row.ticket_id, timeout_s)
        except RequestRefused:
            return waiting
        if state is None or state.pending_decision is None or state.pending_decision.id != row.request_id:
            return waiting
        waiting.state, waiting.request = state, state.pending_decision
        waiting.mine = person in state.pending_decision.allowed
        waiting.why_not = why_not(state.pending_decision, person, context)
        return waiting

    found = await asyncio.gather(*(one(row) for row in rows))
    return sorted(found, key=lambda w: (not w.mine, w.row.requested_at))


async def ticket_page(context: ApiContext, ticket_id: str, person: str) -> TicketPage | None:
    """One ticket with its evidence; None when neither Temporal nor the store knows it."""

    def read() -> tuple[
        TicketSummary | None,
        TicketSpec | None,
        list[VerdictPublic],
        list[AuditEventPublic],
        dict[str, TicketSummary],
    ]:
        with session_scope(context.engine) as session:
            row = queries.get_ticket(session=session, ticket_id=ticket_id)
            filed = _spec_as_filed(row.spec if row is not None else None)
            verdicts = [
                VerdictPublic.model_validate(v)
                for v in queries.verdicts(session=session, ticket_id=ticket_id)
            ]
            events = [
                AuditEventPublic.model_validate(e)
                for e in queries.audit_events(session=session, ticket_id=ticket_id, limit=10_000)
            ]
            children = {
                r.ticket_id: TicketSummary.model_validate(r)
                for r in queries.list_tickets(session=session, limit=1000)
                if r.parent == ticket_id
            }
        return (TicketSummary.model_validate(row) if row else None), filed, verdicts, events, children

    live: TicketState | None = None
    try:
        live = await live_state(await context.client(), ticket_id, context.settings.update_timeout_s)
    except RequestRefused:
        live = None
    projection, filed, verdicts, events, child_rows = await asyncio.to_thread(read)
    if live is None and projection is None:
        return None
    spec = live.spec if live is not None else filed
    pending = live.pending_decision if live is not None else None
    return TicketPage(
        ticket_id=ticket_id,
        projection=projection,
        live=live,
        spec=spec,
        commands=tree_commands(spec) if spec is not None else [],
        children=children_as_recorded(live, child_rows),
        verdicts=verdicts,
        side_by_side=side_by_side(live.attempts if live is not None else []),
        pending=pending,
        why_not=why_not(pending, person, context) if pending is not None else None,
        may_act=_may_act(live, person),
        events=events,
    )


def children_as_recorded(live: TicketState | None, rows: dict[str, TicketSummary]) -> list[tuple[str, str]]:
    """Each sub-ticket with its status as its own trail shows it: the parent records a child's status only when
    the child starts and closes, so its own record says `draft` for a child that is running."""
    named = list(live.children) if live is not None else []
    named += [child for child in rows if child not in named]
    shown = []
    for child in named:
        recorded = rows.get(child)
        status = recorded.status if recorded is not None else (live.children[child].value if live else "")
        shown.append((child, status))
    return shown


def _spec_as_filed(stored: dict[str, object] | None) -> TicketSpec | None:
    """The spec the store kept from the ticket's filing (or latest amendment), when Temporal cannot answer."""
    if not stored:
        return None
    try:
        return TicketSpec.model_validate(stored)
    except ValidationError:
        return None


def _may_act(live: TicketState | None, person: str) -> bool:
    """Whether to offer delegating and cancelling: a decider of an open ticket (the workflow checks again)."""
    if live is None or live.status.is_closed:
        return False
    return person in live.spec.approval.deciders or any(
        person in people for people in live.spec.approval.delegates.values()
    )


def fmt_time(at: datetime | None) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S} UTC" if at is not None else ""


def is_dispatch(request: DecisionRequest) -> bool:
    return request.kind is DecisionKind.DISPATCH
