"""A ticket's record: its state and every change to it, each written to the audit trail and shown in the UI.

`TicketRecord` holds what a TicketWorkflow carries across continue-as-new (the spec as amended, the carry with
its attempts, children and status) beside the trail that writes each change and the decision desk that asks the
ticket's deciders. The workflow decides what happens next (ticket.py, by the pure rules of ticket_rules.py);
this is how it is set, recorded, asked and closed. Workflow code: it runs inside the ticket's workflow.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from daedalus.decisions.desk import Answer, DecisionDesk, E, Waiting
    from daedalus.decisions.schemas import DecisionKind, DecisionRequest, DeskState, TicketSubject
    from daedalus.schemas.audit import AuditKind, TicketSnapshot
    from daedalus.schemas.ticket import TicketCarry, TicketStatus
    from daedalus.workflows import ticket_rules as rules
    from daedalus.workflows.steps import Interrupted, history_is_long
    from daedalus.workflows.ticket_lessons import TicketLessons
    from daedalus.workflows.ticket_ui import TicketUi
    from daedalus.workflows.trail import AuditTrail

if TYPE_CHECKING:
    from daedalus.schemas.ticket import AttemptSummary, SpecAmendment, TicketInput, TicketSpec, TicketState


class TicketRecord:
    def __init__(
        self, ticket: TicketInput, ui: TicketUi, lessons: TicketLessons, *, interrupted: Callable[[], bool]
    ) -> None:
        """`interrupted`: whether the ticket is being cancelled (a decision it waits for is then withdrawn)."""
        self.input = ticket
        self.spec = ticket.spec
        self.ui = ui
        self.lessons = lessons
        self._interrupted = interrupted
        delegates = {k: list(v) for k, v in self.spec.approval.delegates.items()}
        asked_before = ticket.requests_before.get(self.spec.id, 0)
        self.s = ticket.carry or TicketCarry(desk=DeskState(delegates=delegates, requests_made=asked_before))
        self.trail = AuditTrail(
            self.spec.id,
            status=lambda: self.s.status.value,
            view=self.view,
            snapshot=self._snapshot,
            carried=self.s.trail if ticket.carry else None,
        )
        self.desk = DecisionDesk(
            TicketSubject(ticket_id=self.spec.id),
            self.spec.id,
            self.trail,
            self.s.desk,
            deciders=lambda: self.spec.approval.deciders,
        )

    def view(self, seq: int) -> TicketState:
        """The ticket as its status query shows it once event `seq` is written."""
        return rules.view(self.spec, self.s, self.desk.state, seq)

    def require_open(self) -> None:
        if self.s.status.is_closed:
            raise ValueError(f"ticket {self.spec.id} is already closed ({self.s.status.value})")

    def require_decider(self, who: str, action: str) -> None:
        """Amending or cancelling takes a decider of the ticket, or someone they delegated a decision to."""
        if not self.desk.may_act(who):
            raise ValueError(f"{who} may not {action} ticket {self.spec.id}; allowed: {self.desk.actors()}")

    # ---- changes, each recorded -------------------------------------------------------------------------

    def set(self, **changes: Any) -> None:
        self.s = self.s.changed(**changes)

    def replace_attempt(self, summary: AttemptSummary) -> None:
        self.set(attempts=[summary if a.number == summary.number else a for a in self.s.attempts])

    async def filed(self) -> None:
        """The FILED event, with the dispatch rule the server's policy resolved at filing."""
        ticket = self.input
        policy = {"dispatch": ticket.dispatch.reason} if ticket.dispatch is not None else None
        filed = f"filed by {ticket.filed_by}: {self.spec.title}"
        await self.trail.record(AuditKind.FILED, filed, actor=ticket.filed_by, detail=policy, wait=False)

    async def amend(self, amendment: SpecAmendment) -> None:
        """The spec amended (from the next attempt on), written before the update answers."""
        changes = amendment.changes()
        self.spec = self.spec.changed(**changes)
        note = f": {amendment.note}" if amendment.note else ""
        summary = f"{amendment.amended_by} amended {sorted(changes)}{note}"
        await self.trail.record(AuditKind.AMENDED, summary, actor=amendment.amended_by)

    async def attempt_made(self, summary: AttemptSummary, text: str) -> None:
        self.set(attempts=[*self.s.attempts, summary])
        detail = {"branch": summary.branch, "commit": summary.commit or ""}
        await self.trail.record(AuditKind.ATTEMPT, text, detail=detail, wait=False)

    async def child_started(self, child: TicketSpec) -> None:
        self.set(children={**self.s.children, child.id: TicketStatus.DRAFT})
        await self.trail.record(AuditKind.CHILD, f"sub-ticket {child.id} started: {child.title}", wait=False)

    async def child_closed(self, child: str, result: TicketState) -> None:
        """A sub-ticket's outcome; the commit it accepted is where the next one starts (and what is measured)."""
        self.set(
            children={**self.s.children, child: result.status},
            accepted_commit=rules.accepted_commit(result) or self.s.accepted_commit,
        )
        await self.trail.record(
            AuditKind.CHILD,
            f"sub-ticket {child} closed {result.status.value}: {result.outcome_reason}",
            detail={"child": child, "status": result.status.value},
            wait=False,
        )

    async def transition(
        self, status: TicketStatus, summary: str, by: str = "daedalus", detail: dict[str, str] | None = None
    ) -> None:
        """A new status: set, shown in the UI, and written as a TRANSITION event (batched with what follows)."""
        self.set(status=status)
        self.ui.show(self.spec, status, summary)
        await self.trail.record(AuditKind.TRANSITION, summary, actor=by, detail=detail, wait=False)

    async def close(
        self, status: TicketStatus, reason: str, *, by: str = "daedalus", detail: dict[str, str] | None = None
    ) -> None:
        """The closing transition, the lessons of the outcome, then every event written."""
        self.set(outcome_reason=reason)
        await self.transition(status, f"closed {status.value}: {reason}", by=by, detail=detail)
        await self.lessons.outcome(self.spec, status, reason, self.s.attempts)
        await self.trail.flush()  # the ticket is closed once the store holds its whole trail

    # ---- decisions ------------------------------------------------------------------------------------------

    async def ask(
        self,
        kind: DecisionKind,
        question: str,
        options: type[E],
        evidence: list[str],
        excluded: list[str] | None = None,
    ) -> Answer[E]:
        """Ask the ticket's deciders and wait, reminding them and continuing as new while the history grows;
        raises Interrupted when the ticket is cancelled meanwhile."""
        waiting = Waiting(
            reminder=timedelta(seconds=self.spec.approval.reminder_interval_s),
            interrupted=self._interrupted,
            history_is_long=lambda: history_is_long(self.input.history_limit),
            continue_as_new=self._continue_as_new,
        )
        answer = await self.desk.ask(
            kind,
            question,
            options,
            evidence,
            waiting,
            ticket_id=self.spec.id,
            before_write=self._awaiting,
            excluded=excluded or (),
        )
        if answer is None:
            raise Interrupted()
        await self.lessons.decision_note(self.spec, question, answer.decision, kind)
        return answer

    def _awaiting(self, request: DecisionRequest) -> None:
        """The ticket's status and the UI's `DaedalusWaitingFor` move before the request's event is written."""
        escalation = request.kind is DecisionKind.ESCALATION
        self.set(status=TicketStatus.AWAITING_DECISION if escalation else TicketStatus.AWAITING_APPROVAL)
        self.ui.show(self.spec, self.s.status, request.question, waiting_for=request.allowed)

    def _continue_as_new(self) -> NoReturn:
        carry = self.s.model_copy(
            update={"desk": self.desk.state, "trail": self.trail.carry(), "continued": self.s.continued + 1}
        )
        workflow.continue_as_new(self.input.changed(spec=self.spec, carry=carry))

    def _snapshot(self, seq: int, kind: AuditKind) -> TicketSnapshot:
        pending = self.desk.pending
        awaiting = ",".join(pending.allowed) if pending else None
        with_spec = seq == 1 or kind is AuditKind.AMENDED  # the spec as filed, and as amended
        return rules.snapshot(self.spec, self.s, workflow.info(), awaiting, with_spec)
