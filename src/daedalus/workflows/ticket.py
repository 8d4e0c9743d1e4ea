"""TicketWorkflow: one ticket, from filing through dispatch, build and gates to a closed outcome.

Every transition is one audit event (the trail, idempotent on workflow id + sequence number) and is mirrored in
search attributes for the Temporal UI. Decisions go through the decision desk, whose validator rejects a bad
decision before anything is written. The rules (when to stop, what gate results mean) are pure functions in
ticket_rules.py; the state, its trail and desk are the ticket's record (ticket_record.py), carried across
continue-as-new while a decision waits; the host steps are ticket_steps.py; the patches, ticket_patches.py.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TYPE_CHECKING

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from daedalus.decisions.schemas import (
        HOST_PROBLEM_MEANING,
        TICKET_ESCALATION_MEANING,
        Decision,
        DecisionKind,
        Delegation,
        DispatchOption,
        HostProblemOption,
        TicketEscalationOption,
    )
    from daedalus.errors import BrokenInvariant
    from daedalus.ids import ticket_workflow_id
    from daedalus.schemas import search_attributes as sa
    from daedalus.schemas.gates import Verdict
    from daedalus.schemas.ticket import (
        AttemptOutcome,
        AttemptSummary,
        CancelRequest,
        SpecAmendment,
        TicketInput,
        TicketState,
        TicketStatus,
    )
    from daedalus.schemas.ui import start_details, start_summary
    from daedalus.workflows import ticket_rules as rules
    from daedalus.workflows.patches import PatchesAtStart
    from daedalus.workflows.steps import Interrupted, Steps
    from daedalus.workflows.ticket_lessons import TicketLessons
    from daedalus.workflows.ticket_patches import (
        CHILDREN_BUILD_ON_PREDECESSOR,
        CHILDREN_COVERED_BY_DISPATCH,
        HOST_PROBLEM_OPTIONS,
        MEASURES_WHAT_WAS_ACCEPTED,
        PARENT_ANSWERS_FOR_CHILDREN,
        PATCHES_AT_START,
        PATCHES_BUNDLED,
        WAITING_FOR_DELEGATES,
    )
    from daedalus.workflows.ticket_record import TicketRecord
    from daedalus.workflows.ticket_steps import GATE_STARTUP_TIME, HostProblem, TicketSteps
    from daedalus.workflows.ticket_ui import TicketUi

if TYPE_CHECKING:
    from daedalus.schemas.ticket import EngineRef, TicketCarry, TicketSpec


@workflow.defn(name="TicketWorkflow")
class TicketWorkflow:
    @workflow.init
    def __init__(self, ticket: TicketInput) -> None:
        # First: it answers the patches `run` asks in its first activation (ticket_patches.py).
        self.bundled = workflow.patched(PATCHES_BUNDLED)
        self.input = ticket
        self.cancel_request: CancelRequest | None = None
        self.host_problem_options = False
        self.children_covered = False
        self.parent_answers = False
        self.measures_accepted = False
        self.steps = Steps(lambda: self.cancel_request is not None)
        self.ui = TicketUi()
        self.patches = PatchesAtStart(PATCHES_AT_START)
        self.lessons = TicketLessons(self.patches)
        self.rec = TicketRecord(
            ticket, self.ui, self.lessons, interrupted=lambda: self.cancel_request is not None
        )
        self.trail, self.desk = self.rec.trail, self.rec.desk
        self.work = TicketSteps(self.steps, self.trail, self.ui, self.lessons, ticket.hosts, self.patches)
        self.trail.begin()

    @property
    def spec(self) -> TicketSpec:
        """The spec as filed, and as amended since."""
        return self.rec.spec

    @property
    def s(self) -> TicketCarry:
        return self.rec.s

    # ---- queries and updates -------------------------------------------------------------------------

    @workflow.query(name="status")
    def state(self) -> TicketState:
        """The ticket as its audit trail in the store shows it: never ahead of the writes."""
        return self.trail.written

    @workflow.update
    def decide(self, decision: Decision) -> TicketState:
        # Answer the pending decision: the validator has already checked id, option and authority.
        self.desk.answer(decision)
        return self.trail.written  # as the status query shows it

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        self.desk.validate(decision, subject_state=self.s.status.value)

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
        self.rec.require_open()

    @workflow.update
    async def amend(self, amendment: SpecAmendment) -> TicketState:
        """Change the brief, constraints or attempt budget; applies from the next attempt."""
        await self.rec.amend(amendment)
        return self.state()

    @amend.validator
    def _validate_amend(self, amendment: SpecAmendment) -> None:
        self.rec.require_open()
        self.rec.require_decider(amendment.amended_by, "amend")
        problem = rules.amendment_problem(amendment, len(self.s.attempts))
        if problem is not None:
            raise ValueError(problem)

    @workflow.update
    def cancel(self, request: CancelRequest) -> TicketState:
        """Cancel the ticket: the running step (and its process group on the host) is cancelled too."""
        self.cancel_request = request
        self.steps.cancel_running()
        return self.state()

    @cancel.validator
    def _validate_cancel(self, request: CancelRequest) -> None:
        self.rec.require_open()
        self.rec.require_decider(request.requested_by, "cancel")

    # ---- the lifecycle -----------------------------------------------------------------------------

    @workflow.run
    async def run(self, ticket: TicketInput) -> TicketState:
        self.patches.decide(on=self.bundled)
        self.lessons.decide(bundled=self.bundled)
        self.host_problem_options = self._patched(HOST_PROBLEM_OPTIONS)
        self.children_covered = self._patched(CHILDREN_COVERED_BY_DISPATCH)
        self.work.gate_startup = self._patched(GATE_STARTUP_TIME)
        self.parent_answers = self._patched(PARENT_ANSWERS_FOR_CHILDREN)
        self.measures_accepted = self._patched(MEASURES_WHAT_WAS_ACCEPTED)
        self.trail.batch_writes(bundled=self.bundled)
        self.ui.identity(self.spec)
        if ticket.carry is None:
            await self.rec.filed()
        try:
            status, reason = await self._lifecycle()
        except (asyncio.CancelledError, Interrupted):
            self.desk.withdraw()
            cancelled = rules.cancelled_attempt(self.s.attempts)
            if cancelled is not None:
                self.rec.replace_attempt(cancelled)
            reason, by, detail = rules.cancellation(self.cancel_request)
            await self.rec.close(TicketStatus.CANCELLED, reason, by=by, detail=detail)
            return self.state()
        await self.rec.close(status, reason)
        return self.state()

    def _patched(self, patch: str) -> bool:
        """A patch of the run's first activation: on when the run recorded the bundle, else asked on its own."""
        return self.bundled or workflow.patched(patch)

    async def _lifecycle(self) -> rules.Closed:
        spec = self.spec
        rule = self.input.dispatch  # the server's policy, resolved at filing (None: the spec's own rules)
        dispatch = None if self.s.dispatch_approved else rules.dispatch_question(spec, rule)
        if dispatch is not None:
            question, evidence = dispatch
            excluded = rule.excluded if rule is not None else []
            answer = await self.rec.ask(DecisionKind.DISPATCH, question, DispatchOption, evidence, excluded)
            if answer.option is DispatchOption.REJECT:
                return TicketStatus.CANCELLED, f"dispatch rejected by {answer.by}"
            self.rec.set(dispatch_approved=True)
        if spec.children:
            await self._run_children()
        closed = await (self._judge_without_agent() if spec.agent is None else self._attempt_loop())
        return rules.answering_for_children(closed, self.s.children) if self.parent_answers else closed

    async def _run_children(self) -> None:
        if not self.s.children:
            await self.rec.transition(
                TicketStatus.RUNNING_CHILDREN, f"running {len(self.spec.children)} sub-tickets"
            )
        for child in self.spec.with_parent():
            if self.s.children.get(child.id, TicketStatus.DRAFT).is_closed:
                continue  # closed before this ticket continued as new
            self.steps.raise_if_interrupted()
            if self.patches.patched(CHILDREN_BUILD_ON_PREDECESSOR):
                child = rules.builds_on(child, self.s.accepted_commit)
            await self.rec.child_started(child)
            result: TicketState = await self.steps.run(
                workflow.execute_child_workflow(
                    TicketWorkflow.run,
                    rules.child_input(self.input, child, covered_by_parent=self.children_covered),
                    id=ticket_workflow_id(child.id),
                    search_attributes=sa.at_start(child),
                    static_summary=start_summary(child),
                    static_details=start_details(child),
                )
            )
            await self.rec.child_closed(child.id, result)

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
            self.rec.set(attempts=[*self.s.attempts, summary])
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
        if spec.agent is None:
            raise BrokenInvariant(
                f"ticket {spec.id}: an attempt was dispatched with no agent (_lifecycle checks)"
            )
        await self.rec.transition(
            TicketStatus.DISPATCHED, f"attempt {number} dispatched to {spec.agent.name.value}"
        )
        brief = rules.brief(spec, self.s.attempts, number, spec.max_attempts + self.s.granted.extra_attempts)
        summary, text = await self.work.attempt(spec, number, brief)
        await self.rec.attempt_made(summary, text)
        if summary.commit is None:
            return None
        return await self._until_the_host_works(functools.partial(self._build_and_gate, summary))

    async def _build_and_gate(self, summary: AttemptSummary) -> rules.Closed | None:
        spec = self.spec
        if summary.commit is None:
            raise BrokenInvariant(f"ticket {spec.id}: attempt {summary.number} built with no commit")
        if spec.build is not None:
            await self.rec.transition(
                TicketStatus.BUILDING, f"building attempt {summary.number} on {spec.host}"
            )
            failed = await self.work.build(spec, summary)
            if failed is not None:
                self.rec.replace_attempt(failed)
                return None
        return await self._gate_and_decide(summary, commit=summary.commit)

    async def _build_and_measure_as_it_stands(self, summary: AttemptSummary) -> rules.Closed | None:
        """Without an agent: the engine at its sub-tickets' accepted commit (else its base), built as the ticket
        says, then its gates. A failed build is the outcome: there is nobody to fix it."""
        engine = rules.measured_engine(self.spec, self.s.accepted_commit)
        if self.spec.build is not None:
            where = f" at {engine.base_commit}" if engine is not None else ""
            await self.rec.transition(TicketStatus.BUILDING, f"building{where} on {self.spec.host}")
            failed = await self.work.build(self.spec, summary, engine=engine)
            if failed is not None:
                self.rec.replace_attempt(failed)
                return TicketStatus.FAILED, f"the build failed: {failed.detail}"
        commit = self.s.accepted_commit or ""
        return await self._gate_and_decide(summary, commit=commit, engine=engine)

    async def _gate_and_decide(
        self, summary: AttemptSummary, commit: str, engine: EngineRef | None = None
    ) -> rules.Closed | None:
        gates = self.spec.gates
        await self.rec.transition(
            TicketStatus.GATING, f"attempt {summary.number}: measuring {len(gates)} gates"
        )
        results = [await self.work.measure(self.spec, gate, summary.number, commit, engine) for gate in gates]
        judged = rules.judge_gates(self.spec, summary, results)
        self.rec.replace_attempt(judged.attempt)
        if judged.escalate is not None:
            return await self._escalate(judged.escalate)
        return judged.closed

    async def _escalate(
        self, why: str, *, grants_attempt: bool = True, host_problem: bool = False
    ) -> rules.Closed | None:
        self.rec.set(escalation_why=why)
        evidence = rules.evidence(self.s.attempts)
        hosts = host_problem and self.host_problem_options  # a host problem's options, since the patch
        options: type[StrEnum] = HostProblemOption if hosts else TicketEscalationOption
        question = f"{why} What now? ({HOST_PROBLEM_MEANING if hosts else TICKET_ESCALATION_MEANING})"
        asked = await self.rec.ask(DecisionKind.ESCALATION, question, options, evidence)
        closed = rules.escalation_outcome(TicketEscalationOption(asked.option.value), asked.by, why)
        if closed is None and grants_attempt:
            self.rec.set(granted=rules.retry_granted(self.spec, self.s.granted, len(self.s.attempts)))
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
