"""The ticket's pure rules, without a server: when to stop and ask, the same failure twice, what gate results
and the decider's answers mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from daedalus.decisions.schemas import DispatchRule, TicketEscalationOption
from daedalus.schemas.audit import CANCELLED_THROUGH, TEMPORAL_ACTOR
from daedalus.schemas.gates import GateResult, Verdict
from daedalus.schemas.ticket import (
    AttemptOutcome,
    AttemptSummary,
    CancelRequest,
    Granted,
    HostFacts,
    SpecAmendment,
    TicketInput,
    TicketSpec,
    TicketState,
    TicketStatus,
)
from daedalus.workflows import ticket_rules as rules
from tests.support import ticket_spec


def spec(**overrides: object) -> TicketSpec:
    gates = [
        {"name": "decode", "metric": "decode_tps", "threshold": 55, "command": "true"},
        {"name": "batch8", "metric": "decode_tps", "threshold": 55, "command": "true"},
    ]
    return ticket_spec(Path("/repo"), "h", gates=gates, exception_gates=["batch8"], **overrides)


def result(gate: str, verdict: Verdict) -> GateResult:
    return GateResult(gate=gate, metric="decode_tps", verdict=verdict, reason="r", rule="x", method="command")


def attempt(number: int, outcome: AttemptOutcome, *failing: str, cost: float | None = None) -> AttemptSummary:
    results = [result(g, Verdict.FAIL) for g in failing]
    return AttemptSummary(
        number=number, branch=f"b{number}", outcome=outcome, gate_results=results, cost_usd=cost
    )


def test_attempts_used_up_stops() -> None:
    made = [attempt(1, AttemptOutcome.NO_COMMIT), attempt(2, AttemptOutcome.BUILD_FAILED)]
    assert rules.why_stop(spec(max_attempts=2), made, Granted()) == "2 of 2 attempts used without passing"
    assert (
        rules.why_stop(spec(max_attempts=2), made, Granted(extra_attempts=1, retry_granted_after=2)) is None
    )


def test_the_same_failure_twice_stops_but_a_different_one_does_not() -> None:
    same = [
        attempt(1, AttemptOutcome.GATES_FAILED, "decode"),
        attempt(2, AttemptOutcome.GATES_FAILED, "decode"),
    ]
    other = [
        attempt(1, AttemptOutcome.GATES_FAILED, "decode"),
        attempt(2, AttemptOutcome.GATES_FAILED, "batch8"),
    ]
    assert rules.why_stop(spec(max_attempts=5), same, Granted()) == "the same failure twice"
    assert rules.why_stop(spec(max_attempts=5), other, Granted()) is None
    # After a retry only the attempts since count: one more of the same is not "twice" yet.
    third = [*same, attempt(3, AttemptOutcome.GATES_FAILED, "decode")]
    assert rules.same_failure_twice(third[2:]) is False


def test_the_budget_stops_before_it_would_be_exceeded() -> None:
    costly = spec(max_attempts=5, budget_usd=10, agent={"name": "scripted", "patch": "x", "budget_usd": 4})
    made = [attempt(1, AttemptOutcome.NO_COMMIT, cost=3.0), attempt(2, AttemptOutcome.BUILD_FAILED, cost=3.5)]
    assert "budget $10.00 would be exceeded: $6.50 spent" in (rules.why_stop(costly, made, Granted()) or "")
    granted = rules.retry_granted(costly, Granted(), attempts_made=2)
    assert granted == Granted(extra_attempts=1, extra_budget_usd=4.0, retry_granted_after=2)
    assert rules.why_stop(costly, made, granted) is None


@pytest.mark.parametrize(
    ("decode", "batch8", "closed", "escalates"),
    [
        (Verdict.PASS, Verdict.PASS, TicketStatus.PASSED, False),
        (Verdict.PASS, Verdict.FAIL, TicketStatus.CLOSED_UNDER_EXCEPTION, False),
        (Verdict.PASS, Verdict.INCONCLUSIVE, None, True),
        (Verdict.INVALID, Verdict.PASS, None, True),
        (Verdict.FAIL, Verdict.PASS, None, False),  # back to the agent with the evidence
        (Verdict.FAIL, Verdict.INCONCLUSIVE, None, False),  # a FAIL is fixable: not for the decider yet
    ],
)
def test_gate_results_aggregate_into_an_outcome(
    decode: Verdict, batch8: Verdict, closed: TicketStatus | None, escalates: bool
) -> None:
    summary = attempt(1, AttemptOutcome.COMMITTED)
    judged = rules.judge_gates(spec(), summary, [result("decode", decode), result("batch8", batch8)])
    assert (judged.closed[0] if judged.closed else None) is closed
    assert (judged.escalate is not None) is escalates
    passed = decode is Verdict.PASS and batch8 is Verdict.PASS
    assert judged.attempt.outcome is (AttemptOutcome.GATES_PASSED if passed else AttemptOutcome.GATES_FAILED)
    assert [r.gate for r in judged.attempt.gate_results] == ["decode", "batch8"]


@pytest.mark.parametrize("option", list(TicketEscalationOption))
def test_every_escalation_option_has_a_meaning(option: TicketEscalationOption) -> None:
    closed = rules.escalation_outcome(option, "wayne: enough", "the same failure twice")
    if option is TicketEscalationOption.RETRY:
        assert closed is None
    else:
        assert closed is not None and closed[0].is_closed and "wayne: enough" in closed[1]


def test_an_umbrella_passes_only_on_its_children() -> None:
    assert rules.children_outcome({"a": TicketStatus.PASSED})[0] is TicketStatus.PASSED
    excepted = {"a": TicketStatus.PASSED, "b": TicketStatus.CLOSED_UNDER_EXCEPTION}
    assert rules.children_outcome(excepted)[0] is TicketStatus.CLOSED_UNDER_EXCEPTION
    assert rules.children_outcome({"a": TicketStatus.FAILED})[0] is TicketStatus.FAILED


def test_the_brief_carries_the_last_failure() -> None:
    failed = attempt(1, AttemptOutcome.BUILD_FAILED).model_copy(update={"detail": "undefined symbol"})
    text = rules.brief(spec(constraints=["no new deps"]), [failed], 2, 3)
    assert "no new deps" in text and "undefined symbol" in text and "attempt 2 of 3" in text


def closed(status: TicketStatus, *attempts: AttemptSummary) -> TicketState:
    return TicketState(spec=spec(), status=status, attempts=list(attempts))


def committed(number: int, outcome: AttemptOutcome, commit: str) -> AttemptSummary:
    return attempt(number, outcome).model_copy(update={"commit": commit})


def test_the_accepted_commit_is_the_last_one_whose_gates_passed_or_the_decider_accepted() -> None:
    failed, passed = (
        committed(1, AttemptOutcome.GATES_FAILED, "aaa"),
        committed(2, AttemptOutcome.GATES_PASSED, "bbb"),
    )
    assert rules.accepted_commit(closed(TicketStatus.PASSED, failed, passed)) == "bbb"
    # Accepted by the decider (or closed under an exception) with no passing attempt: its last commit.
    assert rules.accepted_commit(closed(TicketStatus.CLOSED_UNDER_EXCEPTION, failed)) == "aaa"
    assert rules.accepted_commit(closed(TicketStatus.FAILED, failed, passed)) is None
    assert rules.accepted_commit(closed(TicketStatus.PASSED)) is None  # an umbrella: nothing of its own


def test_a_child_builds_on_its_predecessor_unless_its_spec_names_a_base() -> None:
    engine = {"name": "toy", "kind": "llama_cpp", "repo": "/repo"}
    default = ticket_spec(Path("/repo"), "h", engine=engine)
    named = ticket_spec(Path("/repo"), "h", engine={**engine, "base_commit": "f7332846"})
    assert rules.builds_on(default, "bbb").engine.base_commit == "bbb"  # type: ignore[union-attr]
    assert rules.builds_on(named, "bbb") == named
    assert rules.builds_on(default, None) == default


def test_a_child_is_filed_by_its_parent_on_the_parents_hosts_and_counts() -> None:
    parent = spec()
    child = spec(id="t-1a")
    rule = DispatchRule(required=True, reason="policy")
    filing = TicketInput(
        spec=parent,
        hosts={"h": HostFacts(schedule_to_start_s=30, gpus=2)},
        requests_before={"t-1a": 3},
        dispatch=rule,
        history_limit=100,
    )
    started = rules.child_input(filing, child, covered_by_parent=True)
    assert started.spec == child and started.filed_by == f"ticket {parent.id}"
    assert started.hosts == filing.hosts and started.requests_before == {"t-1a": 3}
    assert started.dispatch == rules.child_dispatch(rule, child, covered_by_parent=True)
    assert started.dispatch is not None and started.dispatch.covered and not started.dispatch.required
    assert started.history_limit == TicketInput(spec=child).history_limit  # its own default, as it always was
    assert rules.child_input(filing.changed(dispatch=None), child, covered_by_parent=True).dispatch is None


def test_an_amendment_must_change_something_and_keep_the_attempts_made() -> None:
    nothing = SpecAmendment(amended_by="alice")
    assert rules.amendment_problem(nothing, 0) == (
        "an amendment must change the spec text, the constraints or max_attempts"
    )
    fewer = SpecAmendment(amended_by="alice", max_attempts=2)
    assert rules.amendment_problem(fewer, 3) == "max_attempts 2 is below the 3 attempts already made"
    assert rules.amendment_problem(fewer, 2) is None
    assert rules.amendment_problem(SpecAmendment(amended_by="alice", constraints=["no asm"]), 5) is None


def test_a_cancellation_names_the_person_or_temporal() -> None:
    asked = CancelRequest(requested_by="alice", reason="wrong host")
    assert rules.cancellation(asked) == ("cancelled by alice: wrong host", "alice", None)
    reason, by, detail = rules.cancellation(None)
    assert "no person decided it" in reason
    assert by == TEMPORAL_ACTOR and detail == {CANCELLED_THROUGH: "temporal"}


def test_only_a_committed_last_attempt_is_marked_cancelled() -> None:
    building = [attempt(1, AttemptOutcome.NO_COMMIT), attempt(2, AttemptOutcome.COMMITTED)]
    marked = rules.cancelled_attempt(building)
    assert marked is not None and marked.number == 2 and marked.outcome is AttemptOutcome.CANCELLED
    assert (
        rules.cancelled_attempt([attempt(1, AttemptOutcome.COMMITTED), attempt(2, AttemptOutcome.NO_COMMIT)])
        is None
    )
    assert rules.cancelled_attempt([]) is None
