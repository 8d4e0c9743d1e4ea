"""TicketWorkflow: one ticket, from filing through dispatch, build and gates to a closed outcome.

Every transition is one audit event (the trail, idempotent on workflow id + sequence number) and is mirrored in
search attributes for the Temporal UI. Decisions go through the decision desk, whose validator rejects a bad
decision before anything is written. The rules (when to stop, what gate results mean) are pure functions in
ticket_rules.py; the state is one model, carried across continue-as-new while a decision waits.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, NoReturn

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from daedalus.decisions.desk import Answer, DecisionDesk, E, Waiting
    from daedalus.decisions.schemas import (
        HOST_PROBLEM_MEANING,
        TICKET_ESCALATION_MEANING,
        Decision,
        DecisionKind,
        DecisionRequest,
        Delegation,
        DispatchOption,
        HostProblemOption,
        TicketEscalationOption,
        TicketSubject,
    )
    from daedalus.ids import ticket_workflow_id
    from daedalus.schemas import search_attributes as sa
    from daedalus.schemas.audit import CANCELLED_THROUGH, TEMPORAL_ACTOR, AuditKind, TicketSnapshot
    from daedalus.schemas.gates import Verdict
    from daedalus.schemas.ticket import (
        AttemptOutcome,
        AttemptSummary,
        CancelRequest,
        DeskState,
        EngineRef,
        SpecAmendment,
        TicketCarry,
        TicketInput,
        TicketState,
        TicketStatus,
    )
    from daedalus.schemas.ui import start_details, start_summary
    from daedalus.workflows import ticket_rules as rules
    from daedalus.workflows.patches import PatchesAtStart
    from daedalus.workflows.steps import Interrupted, Steps, history_is_long
    from daedalus.workflows.ticket_lessons import TicketLessons
    from daedalus.workflows.ticket_steps import GATE_STARTUP_TIME, HostProblem, TicketSteps
    from daedalus.workflows.ticket_ui import TicketUi
    from daedalus.workflows.trail import AuditTrail

CHILDREN_BUILD_ON_PREDECESSOR = "children-build-on-predecessor"
"""Patch: a sub-ticket starts from its predecessor's accepted commit (histories before it started from base)."""
WAITING_FOR_DELEGATES = "waiting-for-delegates"
"""Patch: a delegation names the delegate in a pending request's `DaedalusWaitingFor` (an upsert)."""
PATCHES_AT_START = "ticket-patches-at-start"
"""Patch: the ticket's patches are on, decided in the run's first activation (patches.py). Each was asked first
right after an audit write (a local activity), which fails replay when a query split their workflow tasks:
`waiting-for-delegates`, `children-build-on-predecessor`, `host-problems-ask-the-decider`,
`gates-hold-gpu-leases`, `ticket-lessons`. Runs started before it ask them lazily, where they always did."""
HOST_PROBLEM_OPTIONS = "host-problem-options"
"""Patch, asked in the run's first activation: a host that cannot run a step asks retry, fail or stop (histories
before it also offered accept and close-under-exception, though nothing had been measured)."""
CHILDREN_COVERED_BY_DISPATCH = "children-covered-by-dispatch"
"""Patch, asked in the run's first activation: once a ticket's dispatch was approved, its sub-tickets run on that
approval, whose evidence listed their commands too (histories before it asked each agent sub-ticket again)."""
PARENT_ANSWERS_FOR_CHILDREN = "parent-answers-for-children"
"""Patch, asked in the run's first activation: a parent passes only when its sub-tickets passed; its own PASS
becomes FAILED (or closed under an exception) when one of them did not (histories before it: every stored one,
the umbrella ones included, closed on the parent's own gates alone)."""
MEASURES_WHAT_WAS_ACCEPTED = "measures-what-was-accepted"
"""Patch, asked in the run's first activation: a ticket without an agent builds (its `build:`) and measures its
engine at the commit its sub-tickets' work was accepted at, else at its base (histories before it measured the base
commit unbuilt, so ticket 6's own gates and a measurement sub-ticket like 6c measured the host's install)."""


@workflow.defn(name="TicketWorkflow")
class TicketWorkflow:
    @workflow.init
    def __init__(self, ticket: TicketInput) -> None:
        self.input = ticket
        self.spec = ticket.spec
        delegates = {k: list(v) for k, v in self.spec.approval.delegates.items()}
        asked_before = ticket.requests_before.get(self.spec.id, 0)
        self.s = ticket.carry or TicketCarry(desk=DeskState(delegates=delegates, requests_made=asked_before))
        carried = self.s.trail if ticket.carry else None
        self.trail = AuditTrail(
            self.spec.id,
            status=lambda: self.s.status.value,
            view=self._view,
            snapshot=self._snapshot,
            carried=carried,
        )
        self.desk = DecisionDesk(
            TicketSubject(ticket_id=self.spec.id),
            self.spec.id,
            self.trail,
            self.s.desk,
            deciders=lambda: self.spec.approval.deciders,
        )
        self.cancel_request: CancelRequest | None = None
        self.host_problem_options = False
        self.children_covered = False
        self.parent_answers = False
        self.measures_accepted = False
        self.steps = Steps(lambda: self.cancel_request is not None)
        self.ui = TicketUi()
        self.patches = PatchesAtStart(PATCHES_AT_START)
        self.lessons = TicketLessons(self.patches)
        self.work = TicketSteps(self.steps, self.trail, self.ui, self.lessons, ticket.hosts, self.patches)
        self.trail.begin()

    # ---- queries and updates -------------------------------------------------------------------------

    @workflow.query(name="status")
    def state(self) -> TicketState:
        """The ticket as its audit trail in the store shows it: never ahead of the writes."""
        return self.trail.written

    def _view(self, seq: int) -> TicketState:
        return rules.view(self.spec, self.s, self.desk.state, seq)

    @workflow.update
    def decide(self, decision: Decision) -> TicketState:
        """Answer the pending decision. The validator has already checked id, option and authority."""
        self.desk.answer(decision)
        return self.state()

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        self.desk.validate(decision, self.s.status.value)

    @workflow.update
    async def delegate(self, delegation: Delegation) -> list[str]:
        """A decider lets someone else decide one kind of decision on their behalf; a pending request of that
        kind names the delegate in `DaedalusWaitingFor` too (an upsert: a command older histories lack)."""
        people = await self.desk.delegate(delegation)
        pending = self.desk.pending
        if pending is not None and self.patches.patched(WAITING_FOR_DELEGATES):
            self.ui.show(self.spec, self.s.status, pending.question, waiting_for=pending.allowed)
        return people

    @delegate.validator
    def _validate_delegate(self, delegation: Delegation) -> None:
        self.desk.validate_delegation(delegation)
        self._require_open()

    @workflow.update
    async def amend(self, amendment: SpecAmendment) -> TicketState:
        """Change the brief, constraints or attempt budget; applies from the next attempt."""
        changes = amendment.changes()
        self.spec = self.spec.changed(**changes)
        note = f": {amendment.note}" if amendment.note else ""
        await self.trail.record(
            AuditKind.AMENDED,
            f"{amendment.amended_by} amended {sorted(changes)}{note}",
            actor=amendment.amended_by,
        )
        return self.state()

    @amend.validator
    def _validate_amend(self, amendment: SpecAmendment) -> None:
        self._require_open()
        self._require_decider(amendment.amended_by, "amend")
        if not amendment.changes():
            raise ValueError("an amendment must change the spec text, the constraints or max_attempts")
        made = len(self.s.attempts)
        if amendment.max_attempts is not None and amendment.max_attempts < made:
            raise ValueError(
                f"max_attempts {amendment.max_attempts} is below the {made} attempts already made"
            )

    @workflow.update
    def cancel(self, request: CancelRequest) -> TicketState:
        """Cancel the ticket: the running step (and its process group on the host) is cancelled too."""
        self.cancel_request = request
        self.steps.cancel_running()
        return self.state()

    @cancel.validator
    def _validate_cancel(self, request: CancelRequest) -> None:
        self._require_open()
        self._require_decider(request.requested_by, "cancel")

    def _require_decider(self, who: str, action: str) -> None:
        """Amending or cancelling takes a decider of the ticket, or someone they delegated a decision to."""
        if not self.desk.may_act(who):
            raise ValueError(f"{who} may not {action} ticket {self.spec.id}; allowed: {self.desk.actors()}")

    def _require_open(self) -> None:
        if self.s.status.is_closed:
            raise ValueError(f"ticket {self.spec.id} is already closed ({self.s.status.value})")

    # ---- the lifecycle -----------------------------------------------------------------------------

    @workflow.run
    async def run(self, ticket: TicketInput) -> TicketState:
        self.patches.decide()
        self.lessons.decide()
        self.host_problem_options = workflow.patched(HOST_PROBLEM_OPTIONS)
        self.children_covered = workflow.patched(CHILDREN_COVERED_BY_DISPATCH)
        self.work.gate_startup = workflow.patched(GATE_STARTUP_TIME)
        self.parent_answers = workflow.patched(PARENT_ANSWERS_FOR_CHILDREN)
        self.measures_accepted = workflow.patched(MEASURES_WHAT_WAS_ACCEPTED)
        self.trail.batch_writes()
        self.ui.identity(self.spec)
        if ticket.carry is None:
            filed = f"filed by {ticket.filed_by}: {self.spec.title}"
            policy = {"dispatch": ticket.dispatch.reason} if ticket.dispatch is not None else None
            await self.trail.record(AuditKind.FILED, filed, actor=ticket.filed_by, detail=policy, wait=False)
        try:
            status, reason = await self._lifecycle()
        except (asyncio.CancelledError, Interrupted):
            self.desk.withdraw()
            attempts = self.s.attempts
            if attempts and attempts[-1].outcome is AttemptOutcome.COMMITTED:
                self._replace_attempt(attempts[-1].changed(outcome=AttemptOutcome.CANCELLED))
            if self.cancel_request is not None:
                who, why = self.cancel_request.requested_by, self.cancel_request.reason
                await self._close(TicketStatus.CANCELLED, f"cancelled by {who}: {why}", actor=who)
            else:  # not a person's decision: the audit writer adds the client and reason Temporal recorded
                await self._close(
                    TicketStatus.CANCELLED,
                    "cancelled through Temporal, outside Daedalus (no person decided it)",
                    actor=TEMPORAL_ACTOR,
                    detail={CANCELLED_THROUGH: "temporal"},
                )
            return self.state()
        await self._close(status, reason)
        return self.state()

    async def _lifecycle(self) -> rules.Closed:
        spec = self.spec
        rule = self.input.dispatch  # the server's policy, resolved at filing (None: the spec's own rules)
        dispatch = None if self.s.dispatch_approved else rules.dispatch_question(spec, rule)
        if dispatch is not None:
            question, evidence = dispatch
            excluded = rule.excluded if rule is not None else []
            answer = await self._ask(DecisionKind.DISPATCH, question, DispatchOption, evidence, excluded)
            if answer.option is DispatchOption.REJECT:
                return TicketStatus.CANCELLED, f"dispatch rejected by {answer.by}"
            self._set(dispatch_approved=True)
        if spec.children:
            await self._run_children()
        closed = await (self._judge_without_agent() if spec.agent is None else self._attempt_loop())
        return rules.answering_for_children(closed, self.s.children) if self.parent_answers else closed

    async def _run_children(self) -> None:
        if not self.s.children:
            await self._transition(
                TicketStatus.RUNNING_CHILDREN, f"running {len(self.spec.children)} sub-tickets"
            )
        for child in self.spec.with_parent():
            if self.s.children.get(child.id, TicketStatus.DRAFT).is_closed:
                continue  # closed before this ticket continued as new
            self.steps.raise_if_interrupted()
            if self.patches.patched(CHILDREN_BUILD_ON_PREDECESSOR):
                child = rules.builds_on(child, self.s.accepted_commit)
            self._set(children={**self.s.children, child.id: TicketStatus.DRAFT})
            started = f"sub-ticket {child.id} started: {child.title}"
            await self.trail.record(AuditKind.CHILD, started, wait=False)
            result: TicketState = await self.steps.run(
                workflow.execute_child_workflow(
                    TicketWorkflow.run,
                    TicketInput(
                        spec=child,
                        filed_by=f"ticket {self.spec.id}",
                        dispatch=rules.child_dispatch(
                            self.input.dispatch, child, covered_by_parent=self.children_covered
                        ),
                        hosts=self.input.hosts,
                        requests_before=self.input.requests_before,
                    ),
                    id=ticket_workflow_id(child.id),
                    search_attributes=sa.at_start(child),
                    static_summary=start_summary(child),
                    static_details=start_details(child),
                )
            )
            self._set(
                children={**self.s.children, child.id: result.status},
                accepted_commit=rules.accepted_commit(result) or self.s.accepted_commit,
            )
            await self.trail.record(
                AuditKind.CHILD,
                f"sub-ticket {child.id} closed {result.status.value}: {result.outcome_reason}",
                detail={"child": child.id, "status": result.status.value},
                wait=False,
            )

    async def _judge_without_agent(self) -> rules.Closed:
        """An umbrella ticket passes on its children; one with gates but no agent measures as it stands."""
        while self.spec.gates:
            if self.desk.pending is not None:  # asked before this ticket continued as new
                closed = await self._escalate(self.s.escalation_why)
                if closed is not None:
                    return closed
            summary = AttemptSummary(
                number=len(self.s.attempts) + 1, branch="", outcome=AttemptOutcome.COMMITTED
            )
            self._set(attempts=[*self.s.attempts, summary])
            measure = (
                functools.partial(self._build_and_measure_as_it_stands, summary)
                if self.measures_accepted
                else functools.partial(self._gate_and_decide, summary, commit="")
            )
            decided = await self._until_the_host_works(measure)
            if decided is not None:
                return decided
            last = self.s.attempts[-1]
            if any(r.verdict is Verdict.FAIL for r in last.gate_results):
                # With no agent there is nobody to fix it: the measurement is the outcome.
                return TicketStatus.FAILED, f"gates did not pass: {last.detail}"
            # Undecided gates, and the decider chose "retry": measure again.
        return rules.children_outcome(self.s.children)

    async def _attempt_loop(self) -> rules.Closed:
        while True:
            if self.desk.pending is not None:  # asked before this ticket continued as new
                why: str | None = self.s.escalation_why
            else:
                rule = rules.why_stop(self.spec, self.s.attempts, self.s.granted)
                why = None if rule is None else f"Ticket {self.spec.id} needs a decision: {rule}."
            if why is not None:
                closed = await self._escalate(why)
                if closed is not None:
                    return closed
            number = len(self.s.attempts) + 1
            closed = await self._until_the_host_works(functools.partial(self._one_attempt, number))
            if closed is not None:
                return closed

    async def _one_attempt(self, number: int) -> rules.Closed | None:
        spec = self.spec
        assert spec.agent is not None  # checked by _lifecycle
        await self._transition(
            TicketStatus.DISPATCHED, f"attempt {number} dispatched to {spec.agent.name.value}"
        )
        brief = rules.brief(spec, self.s.attempts, number, spec.max_attempts + self.s.granted.extra_attempts)
        summary, text = await self.work.attempt(spec, number, brief)
        self._set(attempts=[*self.s.attempts, summary])
        detail = {"branch": summary.branch, "commit": summary.commit or ""}
        await self.trail.record(AuditKind.ATTEMPT, text, detail=detail, wait=False)
        if summary.commit is None:
            return None
        return await self._until_the_host_works(functools.partial(self._build_and_gate, summary))

    async def _build_and_gate(self, summary: AttemptSummary) -> rules.Closed | None:
        spec = self.spec
        assert summary.commit is not None  # only a committed attempt is built and measured
        if spec.build is not None:
            await self._transition(TicketStatus.BUILDING, f"building attempt {summary.number} on {spec.host}")
            failed = await self.work.build(spec, summary)
            if failed is not None:
                self._replace_attempt(failed)
                return None
        return await self._gate_and_decide(summary, commit=summary.commit)

    async def _build_and_measure_as_it_stands(self, summary: AttemptSummary) -> rules.Closed | None:
        """Without an agent: the engine at its sub-tickets' accepted commit (else its base), built as the ticket
        says, then its gates. A failed build is the outcome: there is nobody to fix it."""
        engine = rules.measured_engine(self.spec, self.s.accepted_commit)
        if self.spec.build is not None:
            where = f" at {engine.base_commit}" if engine is not None else ""
            await self._transition(TicketStatus.BUILDING, f"building{where} on {self.spec.host}")
            failed = await self.work.build(self.spec, summary, engine=engine)
            if failed is not None:
                self._replace_attempt(failed)
                return TicketStatus.FAILED, f"the build failed: {failed.detail}"
        commit = self.s.accepted_commit or ""
        return await self._gate_and_decide(summary, commit=commit, engine=engine)

    async def _gate_and_decide(
        self, summary: AttemptSummary, commit: str, engine: EngineRef | None = None
    ) -> rules.Closed | None:
        gates = self.spec.gates
        await self._transition(TicketStatus.GATING, f"attempt {summary.number}: measuring {len(gates)} gates")
        results = [await self.work.measure(self.spec, gate, summary.number, commit, engine) for gate in gates]
        judged = rules.judge_gates(self.spec, summary, results)
        self._replace_attempt(judged.attempt)
        if judged.escalate is not None:
            return await self._escalate(judged.escalate)
        return judged.closed

    async def _escalate(
        self, why: str, *, grants_attempt: bool = True, host_problem: bool = False
    ) -> rules.Closed | None:
        self._set(escalation_why=why)
        evidence = rules.evidence(self.s.attempts)
        option: TicketEscalationOption
        if host_problem and self.host_problem_options:
            question = f"{why} What now? ({HOST_PROBLEM_MEANING})"
            asked = await self._ask(DecisionKind.ESCALATION, question, HostProblemOption, evidence)
            option, by = TicketEscalationOption(asked.option.value), asked.by
        else:
            question = f"{why} What now? ({TICKET_ESCALATION_MEANING})"
            answer = await self._ask(DecisionKind.ESCALATION, question, TicketEscalationOption, evidence)
            option, by = answer.option, answer.by
        closed = rules.escalation_outcome(option, by, why)
        if closed is None and grants_attempt:
            self._set(granted=rules.retry_granted(self.spec, self.s.granted, len(self.s.attempts)))
        return closed

    async def _until_the_host_works(
        self, step: Callable[[], Awaitable[rules.Closed | None]]
    ) -> rules.Closed | None:
        """Run `step`; while its host cannot run it (no worker, a broken environment, GPUs not leased), ask the
        decider, spending no attempt: retry runs the step again."""
        while True:
            try:
                return await step()
            except HostProblem as problem:
                workflow.logger.warning("%s", problem)  # the control worker's log says it too
                closed = await self._escalate(str(problem), grants_attempt=False, host_problem=True)
                if closed is not None:
                    return closed

    # ---- decisions and bookkeeping -------------------------------------------------------------------

    async def _ask(
        self,
        kind: DecisionKind,
        question: str,
        options: type[E],
        evidence: list[str],
        excluded: list[str] | None = None,
    ) -> Answer[E]:
        waiting = Waiting(
            reminder=timedelta(seconds=self.spec.approval.reminder_interval_s),
            interrupted=lambda: self.cancel_request is not None,
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
        self._set(status=TicketStatus.AWAITING_DECISION if escalation else TicketStatus.AWAITING_APPROVAL)
        self.ui.show(self.spec, self.s.status, request.question, waiting_for=request.allowed)

    def _continue_as_new(self) -> NoReturn:
        carry = self.s.model_copy(
            update={"desk": self.desk.state, "trail": self.trail.carry(), "continued": self.s.continued + 1}
        )
        workflow.continue_as_new(self.input.changed(spec=self.spec, carry=carry))

    def _set(self, **changes: Any) -> None:
        self.s = self.s.changed(**changes)

    def _replace_attempt(self, summary: AttemptSummary) -> None:
        self._set(attempts=[summary if a.number == summary.number else a for a in self.s.attempts])

    async def _transition(
        self,
        status: TicketStatus,
        summary: str,
        actor: str = "daedalus",
        detail: dict[str, str] | None = None,
    ) -> None:
        self._set(status=status)
        self.ui.show(self.spec, status, summary)
        await self.trail.record(AuditKind.TRANSITION, summary, actor=actor, detail=detail, wait=False)

    async def _close(
        self, status: TicketStatus, reason: str, actor: str = "daedalus", detail: dict[str, str] | None = None
    ) -> None:
        self._set(outcome_reason=reason)
        await self._transition(status, f"closed {status.value}: {reason}", actor=actor, detail=detail)
        await self.lessons.outcome(self.spec, status, reason, self.s.attempts)
        await self.trail.flush()  # the ticket is closed once the store holds its whole trail

    def _snapshot(self, seq: int, kind: AuditKind) -> TicketSnapshot:
        pending = self.desk.pending
        awaiting = ",".join(pending.allowed) if pending else None
        with_spec = seq == 1 or kind is AuditKind.AMENDED  # the spec as filed, and as amended
        return rules.snapshot(self.spec, self.s, workflow.info(), awaiting, with_spec)
