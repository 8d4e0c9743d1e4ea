"""The ticket's pure rules: when to stop and ask, what counts as the same failure, what gate results and
answers mean for the ticket. No Temporal here: tests/workflows/test_ticket_rules.py checks them directly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, assert_never

from daedalus.decisions.commands import tree_commands
from daedalus.decisions.schemas import DeskState, DispatchRule, TicketEscalationOption
from daedalus.schemas.audit import CANCELLED_THROUGH, TEMPORAL_ACTOR, TicketSnapshot
from daedalus.schemas.gates import GateResult, GateSpec, Verdict
from daedalus.schemas.ticket import (
    AttemptOutcome,
    AttemptSummary,
    CancelRequest,
    EngineRef,
    Granted,
    SpecAmendment,
    TicketCarry,
    TicketInput,
    TicketSpec,
    TicketState,
    TicketStatus,
)

if TYPE_CHECKING:
    from temporalio import workflow

Closed = tuple[TicketStatus, str]
"""A ticket's outcome: the closed status and its reason."""


def dispatch_question(spec: TicketSpec, rule: DispatchRule | None) -> tuple[str, list[str]] | None:
    """The question and evidence for approving the dispatch; None when no approval is needed. With the server
    policy's `rule` (resolved at filing) it decides, and the evidence shows every command that will run on a
    host; without one (no policy, or filed before it), the spec's own approval does, for agent tickets."""
    if rule is None:
        if spec.agent is None or not spec.approval.dispatch_requires_approval:
            return None
        question = f"Dispatch ticket {spec.id} ({spec.title}) to {spec.agent.name.value} on {spec.host}?"
        return question, [f"spec: {spec.spec[:300]}", f"gates: {[g.describe() for g in spec.gates]}"]
    if not rule.required:
        return None
    to = f" to {spec.agent.name.value}" if spec.agent else ""
    question = f"Dispatch ticket {spec.id} ({spec.title}){to} on {spec.host}? ({rule.reason})"
    return question, [*(f"runs {line}" for line in rule.commands), f"spec: {spec.spec[:300]}"]


def child_dispatch(
    rule: DispatchRule | None, child: TicketSpec, *, covered_by_parent: bool = False
) -> DispatchRule | None:
    """A sub-ticket's rule. The parent's dispatch request listed the whole tree's commands, so once it was
    approved (`covered_by_parent`, patch `children-covered-by-dispatch`: a parent that asked, or was covered by
    its own parent) no sub-ticket asks again. Otherwise a child asks when its own spec asks for an agent
    dispatch decision (as every sub-ticket did before the policy)."""
    if rule is None:
        return None
    tree = tree_commands(child)
    if covered_by_parent and (rule.required or rule.covered):
        reason = f"sub-ticket {child.id} runs on its parent's approved dispatch, which listed these commands"
        return DispatchRule(
            required=False, excluded=rule.excluded, commands=tree, reason=reason, covered=True
        )
    asked = child.agent is not None and child.approval.dispatch_requires_approval
    reason = f"sub-ticket {child.id} asks for approval of its agent's dispatch"
    return DispatchRule(required=asked, excluded=rule.excluded, commands=tree, reason=reason)


def child_input(parent: TicketInput, child: TicketSpec, *, covered_by_parent: bool) -> TicketInput:
    """What a sub-ticket is started with: filed by its parent, on the parent's hosts and request counts, under
    the dispatch rule `child_dispatch` gives it."""
    return TicketInput(
        spec=child,
        filed_by=f"ticket {parent.spec.id}",
        dispatch=child_dispatch(parent.dispatch, child, covered_by_parent=covered_by_parent),
        hosts=parent.hosts,
        requests_before=parent.requests_before,
    )


def amendment_problem(amendment: SpecAmendment, attempts_made: int) -> str | None:
    """Why `amendment` cannot apply to a ticket that made `attempts_made` attempts; None when it can."""
    if not amendment.changes():
        return "an amendment must change the spec text, the constraints or max_attempts"
    if amendment.max_attempts is not None and amendment.max_attempts < attempts_made:
        return f"max_attempts {amendment.max_attempts} is below the {attempts_made} attempts already made"
    return None


def cancellation(request: CancelRequest | None) -> tuple[str, str, dict[str, str] | None]:
    """A cancelled ticket's closing reason, who closed it and the event's detail: the person who asked, else
    Temporal (no person decided it; the audit writer adds the client and reason Temporal recorded)."""
    if request is not None:
        return f"cancelled by {request.requested_by}: {request.reason}", request.requested_by, None
    reason = "cancelled through Temporal, outside Daedalus (no person decided it)"
    return reason, TEMPORAL_ACTOR, {CANCELLED_THROUGH: "temporal"}


def cancelled_attempt(attempts: list[AttemptSummary]) -> AttemptSummary | None:
    """The last attempt marked CANCELLED when the ticket was cancelled while it was being built or measured."""
    if attempts and attempts[-1].outcome is AttemptOutcome.COMMITTED:
        return attempts[-1].changed(outcome=AttemptOutcome.CANCELLED)
    return None


def why_stop(spec: TicketSpec, attempts: list[AttemptSummary], budget: Granted) -> str | None:
    """The anti-loop rules: attempts used up, the same failure twice, or the ticket's budget spent."""
    made = len(attempts)
    allowed = spec.max_attempts + budget.extra_attempts
    if made >= allowed:
        return f"{made} of {allowed} attempts used without passing"
    if same_failure_twice(attempts[budget.retry_granted_after :]):
        return "the same failure twice"
    if spec.budget_usd is not None:
        spent = sum(a.cost_usd or 0.0 for a in attempts)
        unknown = sum(1 for a in attempts if a.cost_usd is None and a.branch)
        next_attempt = spec.agent.budget_usd if spec.agent else None
        if spent + (next_attempt or 0.0) > spec.budget_usd + budget.extra_budget_usd:
            note = f" ({unknown} attempts of unknown cost not included)" if unknown else ""
            return f"the ticket budget ${spec.budget_usd:.2f} would be exceeded: ${spent:.2f} spent{note}"
    return None


def retry_granted(spec: TicketSpec, granted: Granted, attempts_made: int) -> Granted:
    """The decider chose retry: one more attempt, with as much agent budget again."""
    return Granted(
        extra_attempts=granted.extra_attempts + 1,
        extra_budget_usd=granted.extra_budget_usd + ((spec.agent.budget_usd if spec.agent else None) or 0.0),
        retry_granted_after=attempts_made,
    )


def same_failure_twice(attempts: list[AttemptSummary]) -> bool:
    """The last two attempts ended the same way, with the same gates not passing."""
    if len(attempts) < 2:
        return False
    a, b = attempts[-2], attempts[-1]
    return a.outcome is b.outcome and failure_signature(a) == failure_signature(b)


def failure_signature(attempt: AttemptSummary) -> tuple[str, ...]:
    failing = sorted(
        f"{r.gate}:{r.verdict.value}" for r in attempt.gate_results if r.verdict is not Verdict.PASS
    )
    return (attempt.outcome.value, *failing)


@dataclass(frozen=True)
class GateOutcome:
    """What an attempt's gate results mean: the attempt as judged, and either an outcome, a reason to ask
    the decider, or neither (back to the agent with the evidence)."""

    attempt: AttemptSummary
    closed: Closed | None = None
    escalate: str | None = None


def judge_gates(spec: TicketSpec, summary: AttemptSummary, results: list[GateResult]) -> GateOutcome:
    """PASS on every gate passes; FAILs only on exception gates close under the exception; undecided gates
    (INCONCLUSIVE, INVALID after their reruns) with no FAIL go to the decider; any other FAIL goes back."""
    verdicts = {r.gate: r.verdict for r in results}
    failed = [g for g, v in verdicts.items() if v is Verdict.FAIL]
    undecided = [g for g, v in verdicts.items() if v in (Verdict.INCONCLUSIVE, Verdict.INVALID)]
    passed = not failed and not undecided
    detail = "; ".join(f"{r.gate}: {r.verdict.value} ({r.reason})" for r in results)
    judged = summary.model_copy(
        update={
            "outcome": AttemptOutcome.GATES_PASSED if passed else AttemptOutcome.GATES_FAILED,
            "gate_results": results,
            "detail": detail,
        }
    )
    if passed:
        return GateOutcome(
            judged,
            closed=(TicketStatus.PASSED, f"all {len(results)} gates passed on attempt {summary.number}"),
        )
    if failed and set(failed) <= set(spec.exception_gates) and not undecided:
        return GateOutcome(
            judged,
            closed=(
                TicketStatus.CLOSED_UNDER_EXCEPTION,
                f"passed except {failed}, which the brief allows as an exception",
            ),
        )
    if undecided and not failed:
        return GateOutcome(
            judged, escalate=f"Ticket {spec.id}: gates {undecided} could not decide after reruns ({detail})."
        )
    return GateOutcome(judged)


def failed_step_result(gate: GateSpec, host: str, commit: str, message: str) -> GateResult:
    """A gate whose step failed on the host (worker lost, crash) is INVALID, never FAIL."""
    return GateResult(
        gate=gate.name,
        metric=gate.metric,
        verdict=Verdict.INVALID,
        reason=f"the gate step failed on {host}: {message}",
        rule=gate.describe(),
        method="command",
        host=host,
        commit=commit,
    )


def escalation_outcome(option: TicketEscalationOption, by: str, why: str) -> Closed | None:
    """What the decider's answer to an escalation means; None is "one more attempt"."""
    match option:
        case TicketEscalationOption.RETRY:
            return None
        case TicketEscalationOption.ACCEPT:
            return TicketStatus.PASSED, f"accepted by {by}"
        case TicketEscalationOption.EXCEPTION:
            return TicketStatus.CLOSED_UNDER_EXCEPTION, f"closed under an exception by {by}"
        case TicketEscalationOption.FAIL:
            return TicketStatus.FAILED, f"failed by {by}"
        case TicketEscalationOption.STOP:
            return TicketStatus.STOPPED_BY_RULES, f"stopped by the rules ({why}) — confirmed by {by}"
        case _:
            assert_never(option)


def accepted_commit(result: TicketState) -> str | None:
    """The commit a closed ticket's work was accepted at: the last attempt whose gates passed, or, when the
    decider accepted it or closed it under an exception, its last commit. None when nothing was accepted."""
    if result.status not in (TicketStatus.PASSED, TicketStatus.CLOSED_UNDER_EXCEPTION):
        return None
    committed = [a for a in result.attempts if a.commit]
    passed = [a for a in committed if a.outcome is AttemptOutcome.GATES_PASSED]
    chosen = (passed or committed)[-1:]
    return chosen[0].commit if chosen else None


def builds_on(child: TicketSpec, predecessor_commit: str | None) -> TicketSpec:
    """A sub-ticket in a sequence starts from its predecessor's accepted commit, unless its spec names a base
    (any `base_commit` other than the default HEAD)."""
    if predecessor_commit is None or child.engine is None or child.engine.base_commit != "HEAD":
        return child
    engine = child.engine.changed(base_commit=predecessor_commit)
    return child.changed(engine=engine)


def children_outcome(children: dict[str, TicketStatus]) -> Closed:
    """An umbrella passes when its children passed; exceptions only close it under an exception."""
    not_passed = {c: s.value for c, s in children.items() if s is not TicketStatus.PASSED}
    if not not_passed:
        return TicketStatus.PASSED, "all sub-tickets passed"
    if all(s == TicketStatus.CLOSED_UNDER_EXCEPTION.value for s in not_passed.values()):
        return TicketStatus.CLOSED_UNDER_EXCEPTION, f"sub-tickets closed under exceptions: {not_passed}"
    return TicketStatus.FAILED, f"sub-tickets did not pass: {not_passed}"


def answering_for_children(closed: Closed, children: dict[str, TicketStatus]) -> Closed:
    """A parent passes only with its sub-tickets: its own PASS becomes the children's outcome when one of them did
    not pass (FAILED, or closed under an exception when only exceptions stand in the way). Any other outcome of
    the parent stands as it is."""
    status, reason = closed
    if status is not TicketStatus.PASSED or not children:
        return closed
    kids, why = children_outcome(children)
    if kids is TicketStatus.PASSED:
        return closed
    return kids, f"{reason}, but {why}"


def measured_engine(spec: TicketSpec, accepted_commit: str | None) -> EngineRef | None:
    """What a ticket without an agent measures: its engine at the commit its sub-tickets' work was accepted at
    (ticket 6's own gates measure 6b-6f's result), else at its base commit."""
    if spec.engine is None or accepted_commit is None:
        return spec.engine
    return spec.engine.changed(base_commit=accepted_commit)


def brief(spec: TicketSpec, attempts: list[AttemptSummary], number: int, allowed: int) -> str:
    """What the agent works from on attempt `number`: the spec, constraints, gates, and the last failure."""
    parts = [f"# Ticket {spec.id}: {spec.title}", spec.spec]
    if spec.constraints:
        parts.append("## Constraints\n" + "\n".join(f"- {c}" for c in spec.constraints))
    if spec.gates:
        parts.append("## Acceptance gates\n" + "\n".join(f"- {g.name}: {g.describe()}" for g in spec.gates))
    if attempts:
        last = attempts[-1]
        parts.append(f"## Previous attempt {last.number} ({last.outcome.value}) — fix this\n{last.detail}")
    parts.append(f"This is attempt {number} of {allowed}.")
    return "\n\n".join(p for p in parts if p)


def evidence(attempts: list[AttemptSummary]) -> list[str]:
    """The attempts side by side, for the decider."""
    return [f"attempt {a.number} [{a.outcome.value}] {a.commit or '-'}: {a.detail[:400]}" for a in attempts]


def snapshot(
    spec: TicketSpec, carry: TicketCarry, info: workflow.Info, awaiting: str | None, with_spec: bool
) -> TicketSnapshot:
    """The ticket's projection as of the event being written."""
    return TicketSnapshot(
        ticket_id=spec.id,
        workflow_id=info.workflow_id,
        run_id=info.first_execution_run_id,
        title=spec.title,
        parent=spec.parent,
        kind=spec.kind.value,
        host=spec.host,
        engine=spec.engine.name if spec.engine else None,
        agent=spec.agent.name.value if spec.agent else None,
        status=carry.status.value,
        attempts=len(carry.attempts),
        awaiting=awaiting,
        outcome_reason=carry.outcome_reason,
        spec=spec.model_dump(mode="json") if with_spec else None,
    )


def view(spec: TicketSpec, carry: TicketCarry, desk: DeskState, seq: int) -> TicketState:
    """The ticket as the status query shows it, as of audit event `seq`."""
    return TicketState(
        spec=spec,
        status=carry.status,
        attempts=carry.attempts,
        pending_decision=desk.pending,
        decisions=desk.decisions,
        children=carry.children,
        outcome_reason=carry.outcome_reason,
        audit_seq=seq,
        continued=carry.continued,
    )
