"""A training run's pure rules, without a server: deaths counted once and what each means for the run, the
evaluation queue and what the watchdog must keep, which evaluation is proposed, and the audit details; and the
hunting ticket the run opens (training/hunt.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from daedalus.decisions.schemas import Decision, DispatchRule, TrainingEscalationOption
from daedalus.schemas.audit import WITHDRAWS_REQUEST
from daedalus.schemas.gates import GateResult, GateSpec, Metric, Verdict
from daedalus.schemas.ticket import TicketKind
from daedalus.schemas.training import (
    CheckpointEvaluated,
    CheckpointEvaluation,
    Death,
    DeathClass,
    Deployment,
    DeploymentOutcome,
    RestartPolicy,
    RunState,
    StopTraining,
    TrainingCarry,
    TrainingRunSpec,
)
from daedalus.training.hunt import deaths_side_by_side, hunting_ticket, hunting_ticket_id
from daedalus.workflows import training_rules as rules
from daedalus.workflows.training_rules import AfterDeath

AT = datetime(2026, 1, 1, tzinfo=UTC)


def run_spec(**overrides: object) -> TrainingRunSpec:
    return TrainingRunSpec.model_validate(
        {
            "name": "leaky",
            "host": "gb10",
            "command": ["python", "train.py", "--steps", "100"],
            "checkpoints": {"directory": "/tmp/ckpt"},
            **overrides,
        }
    )


def death(n: int, cls: DeathClass = DeathClass.KERNEL_OOM, lived_s: float = 60.0, **extra: object) -> Death:
    return Death(
        id=f"leaky#{n}",
        incarnation=n,
        death_class=cls,
        started_at=AT,
        ended_at=AT + timedelta(seconds=lived_s),
        lifetime_s=lived_s,
        summary=f"died {n}",
        curve_path=f"/a/{n}/memory-curve.csv",
        log_tail_path=f"/a/{n}/log-tail.txt",
        **extra,  # type: ignore[arg-type]
    )


def evaluation(checkpoint: str, score: float | None, verdict: Verdict = Verdict.PASS) -> CheckpointEvaluation:
    return CheckpointEvaluation(
        checkpoint=checkpoint, verdict=verdict, rule="r", reason="x", score=score, at=AT
    )


def test_a_death_is_recorded_once_and_only_the_counted_classes_count() -> None:
    restart = RestartPolicy()
    c = rules.with_death(TrainingCarry(), death(1), restart)
    assert c is not None and c.death_counter == 1 and [d.id for d in c.deaths] == ["leaky#1"]
    assert rules.with_death(c, death(1), restart) is None  # the same id again: nothing
    ours = rules.with_death(c, death(2, DeathClass.REQUESTED_STOP), restart)
    assert ours is not None and ours.death_counter == 1 and len(ours.deaths) == 2


def test_a_long_life_resets_the_counter_before_its_own_death_counts() -> None:
    restart = RestartPolicy(reset_after_stable_s=3600)
    c = TrainingCarry(death_counter=2, deaths=[death(1), death(2)])
    after = rules.with_death(c, death(3, lived_s=7200), restart)
    assert after is not None and after.death_counter == 1


@pytest.mark.parametrize(
    ("cls", "carry", "restart", "expected"),
    [
        (DeathClass.CLEAN_EXIT, TrainingCarry(death_counter=5), RestartPolicy(), AfterDeath.FINISHED),
        (DeathClass.REQUESTED_STOP, TrainingCarry(), RestartPolicy(), AfterDeath.STOPPED),
        (
            DeathClass.KERNEL_OOM,
            TrainingCarry(stop=StopTraining(requested_by="alice", reason="r")),
            RestartPolicy(),
            AfterDeath.STOPPED,
        ),
        (DeathClass.KERNEL_OOM, TrainingCarry(death_counter=3), RestartPolicy(), AfterDeath.ESCALATE),
        (
            DeathClass.KERNEL_OOM,
            TrainingCarry(death_counter=1),
            RestartPolicy(restart=False),
            AfterDeath.GAVE_UP,
        ),
        (DeathClass.KERNEL_OOM, TrainingCarry(death_counter=2), RestartPolicy(), AfterDeath.RESTART),
    ],
)
def test_what_a_death_means_for_the_run(
    cls: DeathClass, carry: TrainingCarry, restart: RestartPolicy, expected: AfterDeath
) -> None:
    after = rules.after_death(carry, death(1, cls), restart)
    assert after is expected
    ends = {AfterDeath.FINISHED: RunState.FINISHED, AfterDeath.STOPPED: RunState.STOPPED}
    assert after.ends is ends.get(after, RunState.GAVE_UP if after is AfterDeath.GAVE_UP else None)


def test_an_incarnation_resumes_from_its_predecessors_checkpoint_only() -> None:
    c = TrainingCarry(incarnation=3, deaths=[death(2, last_checkpoint="/ckpt/20")])
    assert rules.resume_from(c) == "/ckpt/20"
    assert rules.start_detail(c, "gb10") == {"incarnation": "3", "host": "gb10", "resume_from": "/ckpt/20"}
    assert rules.resume_from(c.changed(incarnation=4)) is None


def test_counted_deaths_are_the_latest_the_counter_counts() -> None:
    deaths = [death(1), death(2, DeathClass.CRASH), death(3), death(4)]
    assert [d.id for d in rules.counted_deaths(TrainingCarry(deaths=deaths, death_counter=2))] == [
        "leaky#3",
        "leaky#4",
    ]


def test_death_detail_leaves_out_what_is_unknown() -> None:
    detail = rules.death_detail(death(2, signal="SIGKILL"), counter=2)
    assert (
        detail["class"] == "kernel_oom" and detail["signal"] == "SIGKILL" and detail["death_counter"] == "2"
    )
    assert "exit_code" not in detail and "stop_trigger" not in detail


def test_the_closing_line_and_who_ended_the_run() -> None:
    stopped = TrainingCarry(state=RunState.STOPPED, stop=StopTraining(requested_by="alice", reason="enough"))
    assert rules.ending(stopped, []) == "stopped by alice: enough"
    assert rules.ended_by(stopped, []) == "alice"
    decided = Decision(request_id="r1", option=TrainingEscalationOption.STOP, decided_by="bob")
    by_decision = TrainingCarry(state=RunState.STOPPED, deaths=[death(1), death(2), death(3)])
    assert rules.ending(by_decision, [decided]) == "stopped by bob's decision after 3 deaths"
    assert rules.ended_by(by_decision, [decided]) == "bob"
    finished = TrainingCarry(state=RunState.FINISHED, deaths=[death(1, DeathClass.CLEAN_EXIT)])
    assert rules.ending(finished, [decided]) == "finished after leaky#1: died 1"
    assert rules.ended_by(finished, [decided]) == "daedalus"


def test_the_queue_skips_the_oldest_past_max_waiting_but_never_the_one_being_evaluated() -> None:
    c = TrainingCarry(waiting=["/c/1", "/c/2"], seen=["/c/0"])
    assert rules.queued(c, ["/c/0", "/c/1", "/c/2"], busy="/c/1", max_waiting=1) is c  # nothing new
    after = rules.queued(c, ["/c/0", "/c/2", "/c/3", "/c/4"], busy="/c/1", max_waiting=2)
    assert after.waiting == ["/c/1", "/c/3", "/c/4"]
    assert after.skipped == ["/c/2"] and after.seen == ["/c/0", "/c/2"]


def test_the_watchdog_keeps_what_waits_and_what_serves() -> None:
    deployed = Deployment(
        checkpoint="/c/1",
        outcome=DeploymentOutcome.DEPLOYED,
        repo="/r",
        preset="p",
        key="k",
        at=AT,
        summary="s",
    )
    c = TrainingCarry(waiting=["/c/5"], candidate=evaluation("/c/4", 2.0), deployments=[deployed])
    assert rules.needed(c) == ["/c/5", "/c/4", "/c/1"]


def test_better_follows_the_metrics_direction() -> None:
    assert rules.better(Metric.ACCEPTANCE_LENGTH, 3.0, 2.0) and not rules.better(
        Metric.ACCEPTANCE_LENGTH, 2.0, 3.0
    )
    assert rules.better(Metric.TTFT_MS, 10.0, 20.0) and not rules.better(Metric.TTFT_MS, 20.0, 10.0)
    assert rules.better(Metric.TTFT_MS, 20.0, None)


def test_only_an_evaluation_that_clears_and_beats_the_rest_becomes_the_candidate() -> None:
    c = TrainingCarry(waiting=["/c/2", "/c/3"], proposed_best=2.0, skipped=["/c/1"])
    worse = rules.with_evaluation(c, evaluation("/c/2", 1.5), deploys=True, metric=Metric.ACCEPTANCE_LENGTH)
    assert worse.candidate is None and worse.waiting == ["/c/3"] and worse.skipped == []
    best = rules.with_evaluation(
        worse, evaluation("/c/3", 2.5), deploys=True, metric=Metric.ACCEPTANCE_LENGTH
    )
    assert best.candidate is not None and best.candidate.checkpoint == "/c/3"
    failed = rules.with_evaluation(
        c, evaluation("/c/2", 9.0, Verdict.FAIL), deploys=True, metric=Metric.ACCEPTANCE_LENGTH
    )
    assert failed.candidate is None
    no_deploy = rules.with_evaluation(
        c, evaluation("/c/2", 9.0), deploys=False, metric=Metric.ACCEPTANCE_LENGTH
    )
    assert no_deploy.candidate is None and [e.checkpoint for e in no_deploy.evaluations] == ["/c/2"]


def test_an_evaluation_is_scored_by_its_medians() -> None:
    result = GateResult(
        gate="g",
        metric=Metric.ACCEPTANCE_LENGTH,
        verdict=Verdict.PASS,
        reason="ok",
        rule="ratio >= 2.5",
        method="command",
        samples=[4.0, 1.0, 3.0, 2.0],
        baseline_samples=[1.0, 1.0, 2.0],
    )
    evaluated = rules.evaluation_of("/c/40", CheckpointEvaluated(result=result, step=40), ["/c/30"], AT)
    assert (evaluated.score, evaluated.baseline, evaluated.step, evaluated.skipped) == (
        2.5,
        1.0,
        40,
        ["/c/30"],
    )
    detail = rules.evaluation_detail(evaluated, result, None)
    assert detail == {
        "checkpoint": "/c/40",
        "verdict": "PASS",
        "rule": "ratio >= 2.5",
        "step": "40",
        "score": "2.5",
        "baseline": "1",
        "skipped": "/c/30",
    }
    assert rules.median([]) is None


def test_a_failed_evaluation_step_is_an_invalid_verdict_saying_why() -> None:
    gate = GateSpec.model_validate(
        {"name": "drafter", "metric": Metric.ACCEPTANCE_LENGTH, "threshold": 2.5, "command": "x"}
    )
    failed = rules.failed_evaluation(gate, "gb10", "the evaluation step was cancelled")
    assert (
        failed.result.verdict is Verdict.INVALID
        and failed.result.reason == "the evaluation step was cancelled"
    )
    assert failed.result.host == "gb10" and failed.step is None


def test_a_withdrawn_deployment_names_the_request_it_withdraws() -> None:
    withdrawn = Deployment(
        checkpoint="/c/1",
        request_id="req-7",
        outcome=DeploymentOutcome.WITHDRAWN,
        repo="/r",
        preset="p",
        key="k",
        at=AT,
        summary="s",
    )
    detail = rules.deployment_detail(withdrawn, withdrawn="req-7")
    assert detail[WITHDRAWS_REQUEST] == "req-7" and detail["request"] == "req-7"
    skipped = withdrawn.model_copy(update={"outcome": DeploymentOutcome.SKIPPED})
    assert WITHDRAWS_REQUEST not in rules.deployment_detail(skipped, withdrawn=None)


def test_the_hunting_ticket_carries_the_deaths_side_by_side() -> None:
    spec = run_spec()
    deaths = [death(1, min_available_gib=0.4, slope_gib_per_h=-3.25), death(2)]
    assert hunting_ticket_id("leaky", 2) == "hunt-leaky-2"
    table = deaths_side_by_side(deaths).splitlines()
    assert table[0].startswith("| incarnation | class |") and len(table) == 4
    assert (
        "| leaky#1 | kernel_oom | 1.0 min | 0.4 GiB | -3.25 GiB/h | died 1 | /a/1/memory-curve.csv"
        in table[2]
    )
    assert "| - | - |" in table[3]
    ticket = hunting_ticket(spec, "hunt-leaky-1", deaths)
    assert ticket.kind is TicketKind.HUNT and ticket.host == "gb10" and ticket.id == "hunt-leaky-1"
    assert "(`python train.py --steps 100`) died 2 times in a row" in ticket.spec and table[2] in ticket.spec
    assert rules.hunting_dispatch(None, ticket, spec) is None
    rule = rules.hunting_dispatch(DispatchRule(required=False, excluded=["carol"], commands=[]), ticket, spec)
    assert rule is not None and rule.required and rule.excluded == ["carol"]
    assert rule.reason == "a hunting agent for training run leaky on gb10"


def test_the_escalation_asks_with_each_deaths_evidence() -> None:
    question, evidence = rules.escalation("leaky", "hunt-leaky-1", [death(1), death(2)])
    assert question.startswith("Training run leaky died 2 times; hunting ticket hunt-leaky-1 is open.")
    assert evidence == [
        "leaky#1: kernel_oom: died 1 (/a/1/memory-curve.csv)",
        "leaky#2: kernel_oom: died 2 (/a/2/memory-curve.csv)",
    ]


def test_a_segments_budget_covers_its_interval_its_graces_and_the_launch() -> None:
    policy = run_spec().watchdog
    expected = (
        policy.report_interval_s + policy.checkpoint_grace_s + policy.term_grace_s + rules.LAUNCH_ALLOWANCE_S
    )
    assert rules.segment_budget_s(policy) == expected


def test_the_status_shows_what_the_store_has() -> None:
    c = TrainingCarry(state=RunState.RUNNING, incarnation=2, deaths=[death(1)], waiting=["/c/1"])
    status = rules.status(run_spec(), c, (RunState.STARTING, None), audit_seq=4, started_by="alice")
    assert (status.state, status.incarnation, status.audit_seq, status.started_by) == (
        RunState.STARTING,
        2,
        4,
        "alice",
    )
    assert status.waiting_evaluation == ["/c/1"] and status.memory_now is None and status.trainer_pid is None
    assert Path(status.deaths[0].curve_path or "").name == "memory-curve.csv"
