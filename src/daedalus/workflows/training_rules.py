"""A training run's pure rules: what a death means for the run, what its evaluations queue and propose, and what
its audit events and questions say. No Temporal here: tests/workflows/test_training_rules.py checks them
directly, and workflows/training.py and workflows/training_evaluation.py act on what they return."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from daedalus.decisions.schemas import Decision, DecisionRequest, DispatchRule, TrainingEscalationOption
from daedalus.schemas.audit import WITHDRAWS_REQUEST
from daedalus.schemas.gates import METRIC_DIRECTIONS, Direction, GateResult, GateSpec, Metric, Verdict
from daedalus.schemas.ticket import TicketSpec
from daedalus.schemas.training import (
    COUNTED_DEATHS,
    CheckpointEvaluated,
    CheckpointEvaluation,
    Death,
    DeathClass,
    Deployment,
    DeploymentOutcome,
    DeploymentPolicy,
    ProgressReading,
    RestartPolicy,
    RunState,
    TrainingCarry,
    TrainingRunSpec,
    TrainingRunStatus,
    WatchdogPolicy,
)
from daedalus.workflows.ticket_rules import tree_commands

ENDED = (RunState.STOPPED, RunState.FINISHED, RunState.GAVE_UP)
LAUNCH_ALLOWANCE_S = 60.0
"""Beyond the watchdog's report interval and stop graces: the trainer's launch."""
EVALUATIONS_KEPT = 20
"""Evaluations and deployments the run keeps in its state (the store keeps them all)."""
SEEN_KEPT = 64
"""Checkpoints remembered as evaluated or skipped, so a report listing them again never queues them twice."""


def median(values: list[float]) -> float | None:
    """The median, without numpy (workflow code)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def progress_detail(progress: ProgressReading | None) -> dict[str, str]:
    """A progress reading as audit detail, for the report (which reads the store, never the workflow)."""
    if progress is None:
        return {}
    detail = {"step": str(progress.step), "progress": progress.summary()}
    if progress.target_steps is not None:
        detail["target_steps"] = str(progress.target_steps)
    if progress.steps_per_s is not None:
        detail["steps_per_s"] = f"{progress.steps_per_s:.4g}"
    if progress.tokens_per_s is not None:
        detail["tokens_per_s"] = f"{progress.tokens_per_s:.4g}"
    if progress.eta_s is not None:
        detail["eta_s"] = f"{progress.eta_s:.0f}"
    return detail


def status(
    spec: TrainingRunSpec,
    c: TrainingCarry,
    written: tuple[RunState, DecisionRequest | None],
    audit_seq: int,
    started_by: str,
) -> TrainingRunStatus:
    """The `status` query's answer: state and pending decision as the store has them (`written`), memory, slope
    and checkpoint from the watchdog's latest report."""
    state, pending = written
    report = c.last_report
    return TrainingRunStatus(
        name=spec.name,
        host=spec.host,
        state=state,
        incarnation=c.incarnation,
        memory_now=report.memory_now if report else None,
        slope_gib_per_h=report.slope_gib_per_h if report else None,
        leak_flagged=report.leak_flagged if report else False,
        last_checkpoint=report.last_checkpoint if report else None,
        trainer_pid=report.trainer_pid if report and report.death is None else None,
        deaths=c.deaths,
        death_counter=c.death_counter,
        hunting_tickets=c.hunting_tickets,
        pending_decision=pending,
        host_report=c.host_report,
        continued=c.continued,
        audit_seq=audit_seq,
        started_by=started_by,
        progress=report.progress if report else None,
        wakeups=report.wakeups if report else None,
        evaluations=c.evaluations,
        waiting_evaluation=c.waiting,
        deployments=c.deployments,
    )


# ---- incarnations and deaths -------------------------------------------------------------------------------


def segment_budget_s(policy: WatchdogPolicy) -> float:
    """A supervise segment's start-to-close timeout: its interval, the stop's graces and the launch."""
    return policy.report_interval_s + policy.checkpoint_grace_s + policy.term_grace_s + LAUNCH_ALLOWANCE_S


def resume_from(c: TrainingCarry) -> str | None:
    """The checkpoint the current incarnation starts from: the one its predecessor left."""
    last = c.deaths[-1] if c.deaths else None
    if last is not None and last.incarnation == c.incarnation - 1:
        return last.last_checkpoint
    return None


def start_detail(c: TrainingCarry, host: str) -> dict[str, str]:
    resume = resume_from(c)
    detail = {"incarnation": str(c.incarnation), "host": host}
    if resume:
        detail["resume_from"] = resume
    if c.host_report is not None:
        detail["host_report"] = c.host_report.summary()
    return detail


def with_death(c: TrainingCarry, death: Death, restart: RestartPolicy) -> TrainingCarry | None:
    """The carry with `death` recorded and counted; None when it was recorded before (deaths count once per id)."""
    if any(d.id == death.id for d in c.deaths):
        return None
    counter = c.death_counter
    stable = restart.reset_after_stable_s
    if stable is not None and death.lifetime_s >= stable:
        counter = 0  # it lived long enough: the earlier deaths are history, not a loop
    if death.death_class in COUNTED_DEATHS:
        counter += 1
    return c.changed(deaths=[*c.deaths, death], death_counter=counter)


def death_detail(death: Death, counter: int) -> dict[str, str]:
    detail: dict[str, object] = {
        **progress_detail(death.progress),
        "death_id": death.id,
        "incarnation": death.incarnation,
        "class": death.death_class.value,
        "exit_code": death.exit_code,
        "signal": death.signal,
        "lifetime_s": f"{death.lifetime_s:.1f}",
        "last_checkpoint": death.last_checkpoint,
        "min_available_gib": death.min_available_gib,
        "slope_gib_per_h": death.slope_gib_per_h,
        "curve": death.curve_path,
        "log_tail": death.log_tail_path,
        "death_counter": counter,
        "stop_trigger": death.stop_trigger,
        "cgroup_peak_bytes": death.cgroup_peak_bytes,
    }
    return {k: str(v) for k, v in detail.items() if v is not None}


class AfterDeath(StrEnum):
    """What the run does after its current incarnation's death."""

    FINISHED = "finished"
    STOPPED = "stopped"
    GAVE_UP = "gave_up"
    ESCALATE = "escalate"
    RESTART = "restart"

    @property
    def ends(self) -> RunState | None:
        """The state the run ends in; None when it goes on."""
        return {
            AfterDeath.FINISHED: RunState.FINISHED,
            AfterDeath.STOPPED: RunState.STOPPED,
            AfterDeath.GAVE_UP: RunState.GAVE_UP,
        }.get(self)


def after_death(c: TrainingCarry, death: Death, restart: RestartPolicy) -> AfterDeath:
    """A clean exit finishes the run; our stop ends it; the counted deaths escalate; else restart (or give up)."""
    if death.death_class is DeathClass.CLEAN_EXIT:
        return AfterDeath.FINISHED
    if death.death_class is DeathClass.REQUESTED_STOP or c.stop is not None:
        return AfterDeath.STOPPED
    if c.death_counter >= restart.escalate_after_deaths:
        return AfterDeath.ESCALATE
    if not restart.restart:
        return AfterDeath.GAVE_UP
    return AfterDeath.RESTART


def counted_deaths(c: TrainingCarry) -> list[Death]:
    """The deaths the counter counts now (the latest counted ones)."""
    return [d for d in c.deaths if d.death_class in COUNTED_DEATHS][-c.death_counter :]


def escalation(run: str, ticket_id: str, counted: list[Death]) -> tuple[str, list[str]]:
    """The escalation's question and evidence."""
    question = (
        f"Training run {run} died {len(counted)} times; hunting ticket {ticket_id} is open. "
        f"Restart from the last checkpoint, or stop the run?"
    )
    return question, [f"{d.id}: {d.death_class.value}: {d.summary} ({d.curve_path})" for d in counted]


def hunting_dispatch(
    dispatch: DispatchRule | None, hunt: TicketSpec, run: TrainingRunSpec
) -> DispatchRule | None:
    """Under the policy (the run has a rule), a hunting ticket's agent waits for a dispatch decision, which
    whoever the run's rule excluded may not give; with no policy, its spec's own approval decides."""
    if dispatch is None:
        return None
    return DispatchRule(
        required=True,
        excluded=dispatch.excluded,
        commands=tree_commands(hunt),
        reason=f"a hunting agent for training run {run.name} on {run.host}",
    )


def _stopped_by_decision(c: TrainingCarry, decisions: list[Decision]) -> Decision | None:
    last = decisions[-1] if decisions else None
    if c.state is RunState.STOPPED and last is not None and last.option == TrainingEscalationOption.STOP:
        return last
    return None


def ending(c: TrainingCarry, decisions: list[Decision]) -> str:
    """The run's closing line."""
    if c.state is RunState.STOPPED and c.stop is not None:
        return f"stopped by {c.stop.requested_by}: {c.stop.reason}"
    stopped = _stopped_by_decision(c, decisions)
    if stopped is not None:
        return f"stopped by {stopped.decided_by}'s decision after {len(c.deaths)} deaths"
    last = c.deaths[-1] if c.deaths else None
    cause = f" after {last.id}: {last.summary}" if last is not None else ""
    return f"{c.state.value}{cause}"


def ended_by(c: TrainingCarry, decisions: list[Decision]) -> str:
    """Who ended the run: the stop's asker, the decider who chose to stop, or daedalus."""
    if c.stop is not None:
        return c.stop.requested_by
    stopped = _stopped_by_decision(c, decisions)
    return stopped.decided_by if stopped is not None else "daedalus"


# ---- evaluations and deployments -----------------------------------------------------------------------------


def queued(c: TrainingCarry, checkpoints: list[str], busy: str | None, max_waiting: int) -> TrainingCarry:
    """The carry with the complete checkpoints not seen before queued; past `max_waiting` besides the one being
    evaluated (`busy`), the oldest waiting are skipped."""
    known = {*c.seen, *c.waiting}
    new = [path for path in checkpoints if path not in known]
    if not new:
        return c
    rest = [path for path in [*c.waiting, *new] if path != busy]
    cut = max(0, len(rest) - max_waiting)
    skipped, rest = rest[:cut], rest[cut:]
    return c.changed(
        waiting=[busy, *rest] if busy is not None else rest,
        skipped=[*c.skipped, *skipped][-SEEN_KEPT:],
        seen=[*c.seen, *skipped][-SEEN_KEPT:],
    )


def needed(c: TrainingCarry) -> list[str]:
    """Checkpoints the watchdog must not prune: waiting for their evaluation or a deployment decision, or the one
    deployed last."""
    kept = list(c.waiting)
    for evaluation in (c.candidate, c.proposing):
        if evaluation is not None and evaluation.checkpoint not in kept:
            kept.append(evaluation.checkpoint)
    # The checkpoint the serving preset points to now: pruning it would break what serves.
    deployed = [d for d in c.deployments if d.outcome is DeploymentOutcome.DEPLOYED]
    if deployed and deployed[-1].checkpoint not in kept:
        kept.append(deployed[-1].checkpoint)
    return kept


def better(metric: Metric, score: float, than: float | None) -> bool:
    """`score` beats `than` in the metric's direction (anything beats nothing)."""
    if than is None:
        return True
    higher = METRIC_DIRECTIONS[metric] is Direction.HIGHER_IS_BETTER
    return score > than if higher else score < than


def failed_evaluation(gate: GateSpec, host: str, reason: str) -> CheckpointEvaluated:
    """An evaluation step that failed after its retries, or was cancelled: an INVALID verdict saying why."""
    return CheckpointEvaluated(
        result=GateResult(
            gate=gate.name,
            metric=gate.metric,
            verdict=Verdict.INVALID,
            reason=reason,
            rule=gate.describe(),
            method="command",
            host=host,
            gate_spec=gate,
        )
    )


def evaluation_of(
    checkpoint: str, outcome: CheckpointEvaluated, skipped: list[str], at: datetime
) -> CheckpointEvaluation:
    result = outcome.result
    return CheckpointEvaluation(
        checkpoint=checkpoint,
        step=outcome.step,
        verdict=result.verdict,
        rule=result.rule,
        reason=result.reason,
        score=median(result.samples),
        baseline=median(result.baseline_samples) if result.baseline_samples else None,
        median=result.median,
        ci_low=result.ci_low,
        ci_high=result.ci_high,
        unit=result.unit,
        at=at,
        skipped=skipped,
    )


def with_evaluation(
    c: TrainingCarry, evaluated: CheckpointEvaluation, deploys: bool, metric: Metric
) -> TrainingCarry:
    """The carry with an evaluation recorded: out of the queue, and the candidate to propose when it cleared the
    bar (and the run deploys) and beats every one proposed or waiting to be."""
    candidate = c.candidate
    if deploys and evaluated.clears and evaluated.score is not None:
        best = c.proposed_best
        for earlier in (candidate, c.proposing):
            if earlier is not None and earlier.score is not None and better(metric, earlier.score, best):
                best = earlier.score
        if better(metric, evaluated.score, best):
            candidate = evaluated
    return c.changed(
        evaluations=[*c.evaluations, evaluated][-EVALUATIONS_KEPT:],
        waiting=[path for path in c.waiting if path != evaluated.checkpoint],
        seen=[*c.seen, evaluated.checkpoint][-SEEN_KEPT:],
        skipped=[],
        candidate=candidate,
    )


def evaluation_detail(
    evaluated: CheckpointEvaluation, result: GateResult, progress: ProgressReading | None
) -> dict[str, str]:
    return {
        "checkpoint": evaluated.checkpoint,
        "verdict": result.verdict.value,
        "rule": result.rule,
        **({"step": str(evaluated.step)} if evaluated.step is not None else {}),
        **({"score": f"{evaluated.score:.6g}"} if evaluated.score is not None else {}),
        **({"baseline": f"{evaluated.baseline:.6g}"} if evaluated.baseline is not None else {}),
        **({"skipped": ", ".join(evaluated.skipped)} if evaluated.skipped else {}),
        **{f"trainer_{k}": v for k, v in progress_detail(progress).items()},
    }


def proposal(
    run: TrainingRunSpec, deploy: DeploymentPolicy, proposing: CheckpointEvaluation
) -> tuple[str, list[str]]:
    """The deployment request's question and evidence."""
    value = deploy.filled(checkpoint=proposing.checkpoint, step=proposing.step, run=run.name)
    question = (
        f"Training run {run.name}'s {proposing.name} cleared its evaluation: {proposing.summary()}. "
        f"Switch {deploy.preset} in {deploy.repo} ({deploy.key}) to it?"
    )
    evidence = [
        proposing.summary(),
        f"{deploy.key} := {value}",
        f"commit in {deploy.repo} on host {deploy.host or run.host}"
        + (f", branch {deploy.branch}" if deploy.branch else ""),
    ]
    return question, evidence


def deployment_detail(deployment: Deployment, withdrawn: str | None) -> dict[str, str]:
    request_id = None if withdrawn is not None else deployment.request_id
    return {
        "checkpoint": deployment.checkpoint,
        "outcome": deployment.outcome.value,
        "repo": deployment.repo,
        "preset": deployment.preset,
        "key": deployment.key,
        **({"step": str(deployment.step)} if deployment.step is not None else {}),
        **({"request": request_id} if request_id else {}),
        **({"commit": deployment.commit} if deployment.commit else {}),
        **({"value": deployment.value} if deployment.value is not None else {}),
        **({"previous": deployment.previous} if deployment.previous is not None else {}),
        **({WITHDRAWS_REQUEST: withdrawn, "request": withdrawn} if withdrawn is not None else {}),
    }
