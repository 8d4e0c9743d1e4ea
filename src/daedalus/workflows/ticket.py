"""TicketWorkflow: one ticket, from filing through dispatch, build and gates to a closed outcome.

Every transition is one audit event (written by an activity, idempotent on workflow id + sequence number) and
is mirrored in search attributes for the Temporal UI. Decisions arrive through the `decide` update from any
channel; its validator rejects a bad decision before anything is written.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from daedalus.errors import TicketCancelled
    from daedalus.schemas import search_attributes as sa
    from daedalus.schemas.agents import AgentResult, ExitReason
    from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord, TicketSnapshot
    from daedalus.schemas.gates import GateResult, GateSpec, Verdict
    from daedalus.schemas.notify import NotifyResult
    from daedalus.schemas.steps import AttemptInput, BuildInput, BuildResult, GateInput
    from daedalus.schemas.ticket import (
        AttemptOutcome,
        AttemptSummary,
        CancelRequest,
        Decision,
        DecisionKind,
        DecisionRequest,
        Delegation,
        SpecAmendment,
        TicketInput,
        TicketSpec,
        TicketState,
        TicketStatus,
        host_queue,
    )

T = TypeVar("T")

AUDIT_TIMEOUT = timedelta(seconds=30)
# Steps heartbeat every 1-2 s; a host worker that died is noticed after this long and the step retried.
STEP_HEARTBEAT = timedelta(seconds=20)
STEP_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=2))


class Escalation:
    """The options a decider gets when a ticket cannot decide on its own."""

    RETRY = "retry"
    ACCEPT = "accept"
    EXCEPTION = "close-under-exception"
    FAIL = "fail"
    STOP = "stop"
    OPTIONS = [RETRY, ACCEPT, EXCEPTION, FAIL, STOP]
    MEANING = (
        "retry = one more attempt with the evidence; accept = close as passed on your authority; "
        "close-under-exception = close under the brief's exception; fail = close as failed; "
        "stop = stopped by the rules"
    )


class DispatchOption:
    APPROVE = "approve"
    REJECT = "reject"
    OPTIONS = [APPROVE, REJECT]


@dataclass(frozen=True)
class StepFailed:
    """A host step that failed after its retries (worker lost, crash): recorded, then the ticket moves on."""

    message: str


@workflow.defn(name="TicketWorkflow")
class TicketWorkflow:
    @workflow.init
    def __init__(self, ticket: TicketInput) -> None:
        self.spec: TicketSpec = ticket.spec
        self.filed_by = ticket.filed_by
        self.status = TicketStatus.DRAFT
        self.attempts: list[AttemptSummary] = []
        self.pending: DecisionRequest | None = None
        self.decisions: list[Decision] = []
        self.children: dict[str, TicketStatus] = {}
        self.delegates: dict[str, list[str]] = {k: list(v) for k, v in self.spec.approval.delegates.items()}
        self.outcome_reason = ""
        self.seq = 0
        self.requests_made = 0
        self.extra_attempts = 0
        self.cancel_request: CancelRequest | None = None
        self.current_step: asyncio.Task[Any] | None = None
        self.retry_granted_after = 0
        self.extra_budget_usd = 0.0
        self.published: dict[str, str] = {}
        self._answer: Decision | None = None
        # What the store holds: the ticket as of the highest seq with every event up to it written. Queries
        # report this snapshot, never the live fields, so a reader never sees a state (a closed status, a
        # pending decision) whose audit event is still being written.
        self.written: TicketState = self._snapshot()
        self._written_out_of_order: dict[int, TicketState] = {}

    # ---- queries and updates -------------------------------------------------------------------------

    @workflow.query(name="status")
    def state(self) -> TicketState:
        """The ticket as its audit trail in the store shows it: never ahead of the writes."""
        return self.written

    def _snapshot(self) -> TicketState:
        return TicketState(
            spec=self.spec,
            status=self.status,
            attempts=list(self.attempts),
            pending_decision=self.pending,
            decisions=list(self.decisions),
            children=dict(self.children),
            outcome_reason=self.outcome_reason,
            audit_seq=self.seq,
        )

    @workflow.update
    def decide(self, decision: Decision) -> TicketState:
        """Answer the pending decision. The validator has already checked id, option and authority."""
        self._answer = decision
        return self.state()

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        request = self.pending
        if request is None or self._answer is not None:
            raise ValueError(
                f"ticket {self.spec.id} is not waiting for a decision (status: {self.status.value})"
            )
        refusal = request.refusal(decision, f"ticket {self.spec.id}")
        if refusal is not None:
            raise ValueError(refusal)

    @workflow.update
    async def delegate(self, delegation: Delegation) -> list[str]:
        """A decider lets someone else decide one kind of decision on their behalf."""
        people = self.delegates.setdefault(delegation.kind.value, [])
        if delegation.delegate not in people:
            people.append(delegation.delegate)
        if self.pending is not None and self.pending.kind is delegation.kind:
            self.pending = self.pending.model_copy(update={"delegates": list(people)})
        await self._record(
            AuditKind.DELEGATED,
            f"{delegation.granted_by} delegated {delegation.kind.value} decisions to {delegation.delegate}",
            actor=delegation.granted_by,
            detail={
                "kind": delegation.kind.value,
                "delegate": delegation.delegate,
                "channel": delegation.channel,
            },
        )
        return list(people)

    @delegate.validator
    def _validate_delegate(self, delegation: Delegation) -> None:
        if delegation.granted_by not in self.spec.approval.deciders:
            raise ValueError(
                f"{delegation.granted_by} is not a decider of ticket {self.spec.id} and cannot delegate; "
                f"deciders: {self.spec.approval.deciders}"
            )
        self._require_open()

    @workflow.update
    async def amend(self, amendment: SpecAmendment) -> TicketState:
        """Change the brief, constraints or attempt budget; applies from the next attempt."""
        changes: dict[str, Any] = {}
        if amendment.spec is not None:
            changes["spec"] = amendment.spec
        if amendment.constraints is not None:
            changes["constraints"] = amendment.constraints
        if amendment.max_attempts is not None:
            changes["max_attempts"] = amendment.max_attempts
        self.spec = self.spec.model_copy(update=changes)
        await self._record(
            AuditKind.AMENDED,
            f"{amendment.amended_by} amended {sorted(changes)}"
            + (f": {amendment.note}" if amendment.note else ""),
            actor=amendment.amended_by,
        )
        return self.state()

    @amend.validator
    def _validate_amend(self, amendment: SpecAmendment) -> None:
        self._require_open()
        self._require_decider(amendment.amended_by, "amend")
        if amendment.spec is None and amendment.constraints is None and amendment.max_attempts is None:
            raise ValueError("an amendment must change the spec text, the constraints or max_attempts")
        if amendment.max_attempts is not None and amendment.max_attempts < len(self.attempts):
            raise ValueError(
                f"max_attempts {amendment.max_attempts} is below the {len(self.attempts)} attempts already made"
            )

    @workflow.update
    def cancel(self, request: CancelRequest) -> TicketState:
        """Cancel the ticket: the running step (and its process group on the host) is cancelled too."""
        self.cancel_request = request
        if self.current_step is not None and not self.current_step.done():
            self.current_step.cancel()
        return self.state()

    @cancel.validator
    def _validate_cancel(self, request: CancelRequest) -> None:
        self._require_open()
        self._require_decider(request.requested_by, "cancel")

    def _require_decider(self, who: str, action: str) -> None:
        """Amending or cancelling takes a decider of the ticket, or someone they delegated a decision to."""
        allowed = [*self.spec.approval.deciders, *(p for people in self.delegates.values() for p in people)]
        if who.lower() not in allowed:
            raise ValueError(f"{who} may not {action} ticket {self.spec.id}; allowed: {sorted(set(allowed))}")

    def _require_open(self) -> None:
        if self.status.is_closed:
            raise ValueError(f"ticket {self.spec.id} is already closed ({self.status.value})")

    # ---- the lifecycle -----------------------------------------------------------------------------

    @workflow.run
    async def run(self, ticket: TicketInput) -> TicketState:
        self.published = {pair.key.name: str(pair.value) for pair in workflow.info().typed_search_attributes}
        self._publish(
            sa.ticket_identity(self.spec)
        )  # a no-op when the starter set them, as daedalus.client does
        await self._record(
            AuditKind.FILED, f"filed by {self.filed_by}: {self.spec.title}", actor=self.filed_by
        )
        try:
            status, reason = await self._lifecycle()
        except (asyncio.CancelledError, TicketCancelled):
            who = self.cancel_request.requested_by if self.cancel_request else "temporal"
            why = self.cancel_request.reason if self.cancel_request else "workflow cancelled"
            status, reason = TicketStatus.CANCELLED, f"cancelled by {who}: {why}"
            self.pending = None
            if self.attempts and self.attempts[-1].outcome is AttemptOutcome.COMMITTED:
                last = self.attempts[-1]
                self.attempts[-1] = last.model_copy(update={"outcome": AttemptOutcome.CANCELLED})
            await self._close(status, reason, actor=who)
            return self.state()
        await self._close(status, reason)
        return self.state()

    async def _lifecycle(self) -> tuple[TicketStatus, str]:
        spec = self.spec
        if spec.agent is not None and spec.approval.dispatch_requires_approval:
            answer = await self._ask(
                DecisionKind.DISPATCH,
                f"Dispatch ticket {spec.id} ({spec.title}) to {spec.agent.name.value} on {spec.host}?",
                DispatchOption.OPTIONS,
                [f"spec: {spec.spec[:300]}", f"gates: {[g.describe() for g in spec.gates]}"],
            )
            if answer.option == DispatchOption.REJECT:
                return TicketStatus.CANCELLED, f"dispatch rejected by {answer.decided_by}: {answer.note}"
        if spec.children:
            await self._run_children()
        if spec.agent is None:
            return await self._judge_without_agent()
        return await self._attempt_loop()

    async def _run_children(self) -> None:
        await self._transition(
            TicketStatus.RUNNING_CHILDREN, f"running {len(self.spec.children)} sub-tickets"
        )
        for child in self.spec.with_parent():
            self._raise_if_cancelled()
            self.children[child.id] = TicketStatus.DRAFT
            await self._record(AuditKind.CHILD, f"sub-ticket {child.id} started: {child.title}")
            result: TicketState = await self._step(
                workflow.execute_child_workflow(
                    TicketWorkflow.run,
                    TicketInput(spec=child, filed_by=f"ticket {self.spec.id}"),
                    id=f"ticket-{child.id}",
                    search_attributes=sa.at_start(child),
                )
            )
            self.children[child.id] = result.status
            await self._record(
                AuditKind.CHILD,
                f"sub-ticket {child.id} closed {result.status.value}: {result.outcome_reason}",
                detail={"child": child.id, "status": result.status.value},
            )

    async def _judge_without_agent(self) -> tuple[TicketStatus, str]:
        """An umbrella ticket passes on its children; one with gates but no agent measures as it stands."""
        while self.spec.gates:
            summary = AttemptSummary(
                number=len(self.attempts) + 1, branch="", outcome=AttemptOutcome.COMMITTED
            )
            self.attempts.append(summary)
            decided = await self._gate_and_decide(summary, commit="")
            if decided is not None:
                return decided
            if any(r.verdict is Verdict.FAIL for r in self.attempts[-1].gate_results):
                # With no agent there is nobody to fix it: the measurement is the outcome.
                return TicketStatus.FAILED, f"gates did not pass: {self.attempts[-1].detail}"
            # Undecided gates, and the decider chose "retry": measure again.
        not_passed = {c: s.value for c, s in self.children.items() if s is not TicketStatus.PASSED}
        if not not_passed:
            return TicketStatus.PASSED, "all sub-tickets passed"
        if all(s == TicketStatus.CLOSED_UNDER_EXCEPTION.value for s in not_passed.values()):
            return TicketStatus.CLOSED_UNDER_EXCEPTION, f"sub-tickets closed under exceptions: {not_passed}"
        return TicketStatus.FAILED, f"sub-tickets did not pass: {not_passed}"

    async def _attempt_loop(self) -> tuple[TicketStatus, str]:
        number = 0
        while True:
            rule = self._why_stop(number)
            if rule is not None:
                verdict = await self._escalate(f"Ticket {self.spec.id} needs a decision: {rule}.")
                if verdict is not None:
                    return verdict
            number += 1
            outcome = await self._one_attempt(number)
            if outcome is not None:
                return outcome

    async def _one_attempt(self, number: int) -> tuple[TicketStatus, str] | None:
        spec = self.spec
        assert spec.agent is not None  # checked by _lifecycle
        await self._transition(
            TicketStatus.DISPATCHED, f"attempt {number} dispatched to {spec.agent.name.value}"
        )
        result = await self._on_host(
            "run_attempt",
            AttemptInput(
                spec=spec,
                attempt=number,
                brief=self._brief(number),
                filing=workflow.info().first_execution_run_id,
            ),
            AgentResult,
            timedelta(hours=6),
        )
        if isinstance(result, StepFailed):
            summary = AttemptSummary(
                number=number,
                branch="",
                outcome=AttemptOutcome.AGENT_FAILED,
                detail=f"the attempt step failed on {spec.host}: {result.message}",
            )
            await self._record_attempt(
                summary, f"attempt {number}: step failed on the host: {result.message}"
            )
            return None
        if result.exit_reason is not ExitReason.COMMITTED or result.commit is None:
            outcome = (
                AttemptOutcome.NO_COMMIT
                if result.exit_reason is ExitReason.NO_COMMIT
                else AttemptOutcome.AGENT_FAILED
            )
            summary = AttemptSummary(
                number=number,
                branch=result.branch,
                outcome=outcome,
                detail=result.summary(),
                cost_usd=result.usage.cost_usd,
                cost_source=result.usage.cost_source,
            )
            await self._record_attempt(
                summary, f"attempt {number}: agent produced no usable commit ({result.exit_reason.value})"
            )
            return None
        summary = AttemptSummary(
            number=number,
            branch=result.branch,
            commit=result.commit,
            outcome=AttemptOutcome.COMMITTED,
            cost_usd=result.usage.cost_usd,
            cost_source=result.usage.cost_source,
        )
        await self._record_attempt(
            summary, f"attempt {number}: {result.agent} committed {result.commit[:12]} ({result.diff_stat})"
        )
        if spec.build is not None:
            await self._transition(TicketStatus.BUILDING, f"building attempt {number} on {spec.host}")
            build = await self._on_host(
                "run_build",
                BuildInput(
                    ticket_id=spec.id,
                    attempt=number,
                    command=spec.build.command,
                    timeout_s=spec.build.timeout_s,
                ),
                BuildResult,
                timedelta(seconds=spec.build.timeout_s + 60),
            )
            if isinstance(build, StepFailed):
                build = BuildResult(
                    ok=False, returncode=-1, log="", log_tail=f"build step failed: {build.message}"
                )
            if not build.ok:
                failed = summary.model_copy(
                    update={
                        "outcome": AttemptOutcome.BUILD_FAILED,
                        "detail": f"build exited {build.returncode}: {build.log_tail[-600:]}",
                    }
                )
                await self._record(
                    AuditKind.BUILD,
                    f"attempt {number}: build failed (exit {build.returncode})",
                    detail={"log": build.log},
                )
                self._replace_attempt(failed)
                return None
            await self._record(AuditKind.BUILD, f"attempt {number}: build passed", detail={"log": build.log})
        return await self._gate_and_decide(summary, commit=result.commit)

    async def _gate_and_decide(self, summary: AttemptSummary, commit: str) -> tuple[TicketStatus, str] | None:
        spec = self.spec
        await self._transition(
            TicketStatus.GATING, f"attempt {summary.number}: measuring {len(spec.gates)} gates"
        )
        results: list[GateResult] = []
        for gate in spec.gates:
            result = await self._measure(gate, summary.number, commit)
            results.append(result)
        verdicts = {r.gate: r.verdict for r in results}
        failed = [g for g, v in verdicts.items() if v is Verdict.FAIL]
        undecided = [g for g, v in verdicts.items() if v in (Verdict.INCONCLUSIVE, Verdict.INVALID)]
        outcome = AttemptOutcome.GATES_PASSED if not failed and not undecided else AttemptOutcome.GATES_FAILED
        detail = "; ".join(f"{r.gate}: {r.verdict.value} ({r.reason})" for r in results)
        self._replace_attempt(
            summary.model_copy(update={"outcome": outcome, "gate_results": results, "detail": detail})
        )
        if not failed and not undecided:
            return TicketStatus.PASSED, f"all {len(results)} gates passed on attempt {summary.number}"
        if failed and set(failed) <= set(spec.exception_gates) and not undecided:
            return (
                TicketStatus.CLOSED_UNDER_EXCEPTION,
                f"passed except {failed}, which the brief allows as an exception",
            )
        if undecided and not failed:
            return await self._escalate(
                f"Ticket {spec.id}: gates {undecided} could not decide after reruns ({detail})."
            )
        return None

    async def _measure(self, gate: GateSpec, attempt: int, commit: str) -> GateResult:
        """Measure a gate; INCONCLUSIVE and INVALID are rerun automatically before anyone is asked."""
        reruns = self.spec.approval.inconclusive_reruns
        for round_number in range(1, reruns + 2):
            measured = await self._on_host(
                "run_gate",
                GateInput(
                    ticket_id=self.spec.id,
                    attempt=attempt,
                    round=round_number,
                    gate=gate,
                    host=self.spec.host,
                    commit=commit,
                    engine=self.spec.engine if self.spec.agent is None else None,
                ),
                GateResult,
                timedelta(seconds=gate.timeout_s + 60),
            )
            result = (
                GateResult(
                    gate=gate.name,
                    metric=gate.metric,
                    verdict=Verdict.INVALID,
                    reason=f"the gate step failed on {self.spec.host}: {measured.message}",
                    rule=gate.describe(),
                    method="command",
                    host=self.spec.host,
                    commit=commit,
                )
                if isinstance(measured, StepFailed)
                else measured
            )
            await self._record(
                AuditKind.GATE,
                f"attempt {attempt}: gate {gate.name} round {round_number}: {result.verdict.value} — {result.reason}",
                detail={"gate": gate.name, "verdict": result.verdict.value, "round": str(round_number)},
                gate_results=[result],
                attempt=attempt,
            )
            if result.verdict in (Verdict.PASS, Verdict.FAIL):
                return result
        return result

    async def _escalate(self, why: str) -> tuple[TicketStatus, str] | None:
        evidence = [
            f"attempt {a.number} [{a.outcome.value}] {a.commit or '-'}: {a.detail[:400]}"
            for a in self.attempts
        ]
        answer = await self._ask(
            DecisionKind.ESCALATION, f"{why} What now? ({Escalation.MEANING})", Escalation.OPTIONS, evidence
        )
        by = f"{answer.decided_by}" + (f": {answer.note}" if answer.note else "")
        if answer.option == Escalation.RETRY:
            self.extra_attempts += 1
            if self.spec.agent is not None and self.spec.agent.budget_usd is not None:
                self.extra_budget_usd += self.spec.agent.budget_usd
            self.retry_granted_after = len(self.attempts)
            return None
        if answer.option == Escalation.ACCEPT:
            return TicketStatus.PASSED, f"accepted by {by}"
        if answer.option == Escalation.EXCEPTION:
            return TicketStatus.CLOSED_UNDER_EXCEPTION, f"closed under an exception by {by}"
        if answer.option == Escalation.FAIL:
            return TicketStatus.FAILED, f"failed by {by}"
        return TicketStatus.STOPPED_BY_RULES, f"stopped by the rules ({why}) — confirmed by {by}"

    # ---- decisions -----------------------------------------------------------------------------------

    async def _ask(
        self, kind: DecisionKind, question: str, options: list[str], evidence: list[str]
    ) -> Decision:
        self.requests_made += 1
        request = DecisionRequest(
            id=f"{self.spec.id}-{kind.value}-{self.requests_made}",
            ticket_id=self.spec.id,
            kind=kind,
            question=question,
            options=options,
            evidence=evidence,
            deciders=self.spec.approval.deciders,
            delegates=self.delegates.get(kind.value, []),
            requested_at=workflow.now(),
        )
        self.pending = request
        self._answer = None
        await self._transition(
            TicketStatus.AWAITING_DECISION
            if kind is DecisionKind.ESCALATION
            else TicketStatus.AWAITING_APPROVAL,
            f"asked {', '.join(self._allowed(kind))}: {question}",
            decision_request=request,
        )
        await self._notify(request)
        reminder = timedelta(seconds=self.spec.approval.reminder_interval_s)
        while True:
            try:
                await workflow.wait_condition(
                    lambda: self._answer is not None or self.cancel_request is not None, timeout=reminder
                )
            except TimeoutError:
                self.pending = request = request.model_copy(
                    update={"reminders_sent": request.reminders_sent + 1}
                )
                await self._record(
                    AuditKind.DECISION_REMINDER,
                    f"reminder {request.reminders_sent}: {request.id} still waits for a decision",
                )
                await self._notify(request)
                continue
            if self.cancel_request is not None:
                raise TicketCancelled()
            break
        answer = self._answer
        assert answer is not None
        self.decisions.append(answer)
        self.pending = None
        self._answer = None
        await self._record(
            AuditKind.DECIDED,
            f"{answer.decided_by} chose {answer.option!r} for {request.id} via {answer.channel}",
            actor=answer.decided_by,
            decision=answer,
            detail={"request": request.id, "option": answer.option, "channel": answer.channel},
        )
        return answer

    async def _notify(self, request: DecisionRequest) -> None:
        """Tell the deciders (Slack); a notification problem is logged and never blocks the ticket."""
        try:
            await workflow.execute_activity(
                "notify_decision_request",
                request,
                result_type=NotifyResult,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=2)),
            )
        except ActivityError as error:
            workflow.logger.warning("notifying %s failed: %s", request.id, error)

    def _allowed(self, kind: DecisionKind) -> list[str]:
        return self.spec.approval.deciders + self.delegates.get(kind.value, [])

    # ---- bookkeeping ---------------------------------------------------------------------------------

    def _brief(self, number: int) -> str:
        parts = [f"# Ticket {self.spec.id}: {self.spec.title}", self.spec.spec]
        if self.spec.constraints:
            parts.append("## Constraints\n" + "\n".join(f"- {c}" for c in self.spec.constraints))
        if self.spec.gates:
            parts.append(
                "## Acceptance gates\n" + "\n".join(f"- {g.name}: {g.describe()}" for g in self.spec.gates)
            )
        if self.attempts:
            last = self.attempts[-1]
            parts.append(
                f"## Previous attempt {last.number} ({last.outcome.value}) — fix this\n{last.detail}"
            )
        parts.append(f"This is attempt {number} of {self.spec.max_attempts + self.extra_attempts}.")
        return "\n\n".join(p for p in parts if p)

    def _why_stop(self, attempts_made: int) -> str | None:
        """The anti-loop rules: attempts used up, the same failure twice, or the ticket's budget spent."""
        allowed = self.spec.max_attempts + self.extra_attempts
        if attempts_made >= allowed:
            return f"{attempts_made} of {allowed} attempts used without passing"
        if self._same_failure_twice():
            return "the same failure twice"
        budget = self.spec.budget_usd
        if budget is not None:
            spent = sum(a.cost_usd or 0.0 for a in self.attempts)
            unknown = sum(1 for a in self.attempts if a.cost_usd is None and a.branch)
            next_attempt = self.spec.agent.budget_usd if self.spec.agent else None
            if spent + (next_attempt or 0.0) > budget + self.extra_budget_usd:
                note = f" ({unknown} attempts of unknown cost not included)" if unknown else ""
                return f"the ticket budget ${budget:.2f} would be exceeded: ${spent:.2f} spent{note}"
        return None

    def _same_failure_twice(self) -> bool:
        recent = self.attempts[self.retry_granted_after :]
        if len(recent) < 2:
            return False
        a, b = recent[-2], recent[-1]
        return a.outcome is b.outcome and _failure_signature(a) == _failure_signature(b)

    async def _record_attempt(self, summary: AttemptSummary, text: str) -> None:
        self.attempts.append(summary)
        await self._record(
            AuditKind.ATTEMPT, text, detail={"branch": summary.branch, "commit": summary.commit or ""}
        )

    def _replace_attempt(self, summary: AttemptSummary) -> None:
        self.attempts = [summary if a.number == summary.number else a for a in self.attempts]

    async def _on_host(
        self, activity: str, argument: Any, result_type: type[T], timeout: timedelta
    ) -> T | StepFailed:
        """Run a step on the ticket's host queue; a step that fails after its retries is a result, not a crash."""
        try:
            return await self._step(
                workflow.execute_activity(
                    activity,
                    argument,
                    result_type=result_type,
                    task_queue=host_queue(self.spec.host),
                    start_to_close_timeout=timeout,
                    heartbeat_timeout=STEP_HEARTBEAT,
                    retry_policy=STEP_RETRY,
                )
            )
        except ActivityError as error:
            cause = error.cause
            return StepFailed(message=str(cause.message if isinstance(cause, FailureError) else error))

    async def _step(self, awaitable: Awaitable[T]) -> T:
        """Run one step so that `cancel` can interrupt it (and the activity's process group with it).

        Once a cancel is requested, whatever the interrupted step raises (CancelledError, or the ActivityError
        or ChildWorkflowError that wraps it) means "cancelled", never "the step failed".
        """
        self._raise_if_cancelled(awaitable)
        task = asyncio.ensure_future(awaitable)
        self.current_step = task
        try:
            return await task
        except BaseException:
            if self.cancel_request is not None:
                raise TicketCancelled() from None
            raise
        finally:
            self.current_step = None

    def _raise_if_cancelled(self, pending: object = None) -> None:
        if self.cancel_request is None:
            return
        if inspect.iscoroutine(pending):
            pending.close()  # never started: close it rather than leave it unawaited
        raise TicketCancelled()

    async def _transition(self, status: TicketStatus, summary: str, **extra: Any) -> None:
        self.status = status
        awaiting = (
            ",".join(self._allowed(extra["decision_request"].kind)) if "decision_request" in extra else ""
        )
        self._publish({sa.STATUS: status.value, sa.AWAITING: awaiting})
        await self._record(
            AuditKind.TRANSITION if "decision_request" not in extra else AuditKind.DECISION_REQUESTED,
            summary,
            **extra,
        )

    def _publish(self, values: dict[SearchAttributeKey[str], str]) -> None:
        """Mirror state in the Temporal UI's search attributes; only changed values (each upsert is a write)."""
        changed = [
            key.value_set(value) for key, value in values.items() if self.published.get(key.name) != value
        ]
        if changed:
            workflow.upsert_search_attributes(changed)
            self.published.update({key.name: value for key, value in values.items()})

    async def _close(self, status: TicketStatus, reason: str, actor: str = "daedalus") -> None:
        self.outcome_reason = reason
        await self._transition(status, f"closed {status.value}: {reason}", actor=actor)

    async def _record(
        self,
        kind: AuditKind,
        summary: str,
        *,
        actor: str = "daedalus",
        detail: dict[str, str] | None = None,
        decision_request: DecisionRequest | None = None,
        decision: Decision | None = None,
        gate_results: list[GateResult] | None = None,
        attempt: int = 0,
    ) -> None:
        self.seq += 1
        seq = self.seq
        snapshot = self._snapshot()
        info = workflow.info()
        spec = self.spec
        first_or_amended = seq == 1 or kind is AuditKind.AMENDED
        record = AuditRecord(
            event=AuditEvent(
                workflow_id=info.workflow_id,
                run_id=info.first_execution_run_id,
                seq=seq,
                ticket_id=spec.id,
                kind=kind,
                actor=actor.lower(),
                at=workflow.now(),
                status=self.status.value,
                summary=summary,
                detail=detail or {},
            ),
            ticket=TicketSnapshot(
                ticket_id=spec.id,
                workflow_id=info.workflow_id,
                run_id=info.first_execution_run_id,
                title=spec.title,
                parent=spec.parent,
                kind=spec.kind.value,
                host=spec.host,
                engine=spec.engine.name if spec.engine else None,
                agent=spec.agent.name.value if spec.agent else None,
                status=self.status.value,
                attempts=len(self.attempts),
                awaiting=",".join(self._allowed(self.pending.kind)) if self.pending else None,
                outcome_reason=self.outcome_reason,
                spec=spec.model_dump(mode="json") if first_or_amended else None,
            ),
            decision_request=decision_request,
            decision=decision,
            attempt=attempt,
            gate_results=gate_results or [],
        )
        await workflow.execute_activity(
            "record_audit_event", record, result_type=bool, start_to_close_timeout=AUDIT_TIMEOUT
        )
        self._mark_written(snapshot)

    def _mark_written(self, snapshot: TicketState) -> None:
        """Advance the written prefix; concurrent handlers may finish their writes out of order."""
        self._written_out_of_order[snapshot.audit_seq] = snapshot
        while self.written.audit_seq + 1 in self._written_out_of_order:
            self.written = self._written_out_of_order.pop(self.written.audit_seq + 1)


def _failure_signature(attempt: AttemptSummary) -> tuple[str, ...]:
    failing = sorted(
        f"{r.gate}:{r.verdict.value}" for r in attempt.gate_results if r.verdict is not Verdict.PASS
    )
    return (attempt.outcome.value, *failing)
