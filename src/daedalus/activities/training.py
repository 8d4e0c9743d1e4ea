"""Training-run activities; all run on the host's task queue (`host-<name>`), next to the trainer."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio import activity

from daedalus.activities.gates import parse_measurement
from daedalus.activities.refs import (
    DEPLOY_CHECKPOINT,
    EVALUATE_CHECKPOINT,
    SUPERVISE_TRAINING,
    TRAINING_HOST_REPORT,
)
from daedalus.confinement import StepSettings
from daedalus.engines.serving_config import deploy
from daedalus.errors import SandboxError, maps_errors
from daedalus.gates.verdicts import judge
from daedalus.processes import log_tail
from daedalus.schemas.gates import GateResult, Verdict
from daedalus.schemas.limits import GATE_OUTPUT_BYTES
from daedalus.schemas.steps import ResourceLimits
from daedalus.schemas.training import (
    CheckpointEvaluated,
    DeploymentInput,
    DeploymentResult,
    EvaluationInput,
    HostReport,
    HostReportInput,
    SegmentReport,
    SuperviseInput,
)
from daedalus.training.checkpoint_eval import checkpoint_step, run_evaluation
from daedalus.training.host_report import host_report
from daedalus.training.supervisor import supervise_segment


class TrainingActivities:
    """Holds the host's artifact and state roots, so that tests (and odd hosts) can put them anywhere, and how
    the host confines a step (its settings and limits), for the runs' checkpoint evaluations."""

    def __init__(
        self,
        artifact_dir: Path,
        state_dir: Path | None = None,
        *,
        steps: StepSettings | None = None,
        limits: ResourceLimits | None = None,
    ):
        self.artifact_dir = artifact_dir
        self.state_dir = state_dir or artifact_dir / "training-state"
        self.steps = steps or StepSettings()
        self.limits = limits or self.steps.limits

    @activity.defn(name=SUPERVISE_TRAINING.name)
    @maps_errors
    async def supervise_training(self, inp: SuperviseInput) -> SegmentReport:
        """Start or re-attach to the incarnation, watch it for one report interval, report what it saw."""
        details = activity.info().heartbeat_details
        resume = details[0] if details and isinstance(details[0], dict) else None
        return await supervise_segment(
            inp,
            state_root=inp.spec.state_dir or self.state_dir,
            artifact_root=inp.spec.artifact_dir or self.artifact_dir,
            heartbeat=lambda d: activity.heartbeat(d),
            resume=resume,
            cgroup_root=self.steps.cgroup_root,
        )

    @activity.defn(name=TRAINING_HOST_REPORT.name)
    @maps_errors
    async def training_host_report(self, inp: HostReportInput) -> HostReport:
        """The host's invisible players (earlyoom, systemd-oomd, swapoff crons) and its swap."""
        return await asyncio.to_thread(host_report, inp)

    @activity.defn(name=EVALUATE_CHECKPOINT.name)
    @maps_errors
    async def evaluate_checkpoint(self, inp: EvaluationInput) -> CheckpointEvaluated:
        """Measure one complete checkpoint with the run's evaluation gate, confined; a checkpoint that is gone, a
        command that crashes or prints no valid measurement is an INVALID verdict, never a FAIL."""
        evaluation = inp.spec.evaluation
        assert evaluation is not None, "only a run with an evaluation evaluates its checkpoints"
        checkpoint = Path(inp.checkpoint)
        step = inp.step if inp.step is not None else checkpoint_step(checkpoint)
        marker = inp.spec.checkpoints.marker
        if not (checkpoint / marker).is_file():
            return CheckpointEvaluated(
                step=step,
                result=_invalid(inp, f"the checkpoint {checkpoint} is gone or not complete ({marker})"),
            )
        try:
            done = await run_evaluation(
                inp,
                artifact_root=inp.spec.artifact_dir or self.artifact_dir,
                steps=self.steps,
                limits=self.limits,
                heartbeat=activity.heartbeat,
                step=step,
            )
        except SandboxError as error:
            return CheckpointEvaluated(
                step=step, result=_invalid(inp, f"the evaluation could not be confined: {error}")
            )
        evidence = {"stdout": str(done.stdout), "log": str(done.log), "checkpoint": str(checkpoint)}
        finished = done.finished
        if finished.limits_hit:
            reason = "; ".join(f"the evaluation {hit}" for hit in finished.limits_hit)
            return CheckpointEvaluated(step=step, result=_invalid(inp, reason, evidence))
        if finished.timed_out or finished.returncode != 0:
            what = (
                f"timed out after {evaluation.gate.timeout_s}s"
                if finished.timed_out
                else f"exited {finished.returncode}"
            )
            reason = f"the evaluation command {what}: {log_tail(done.log, 600)}"
            return CheckpointEvaluated(step=step, result=_invalid(inp, reason, evidence))
        try:
            measurement = parse_measurement(log_tail(done.stdout, GATE_OUTPUT_BYTES))
        except ValueError as error:
            return CheckpointEvaluated(step=step, result=_invalid(inp, str(error), evidence))
        if finished.unlimited:
            evidence["limits"] = finished.unlimited
        measurement = measurement.model_copy(update={"evidence": {**measurement.evidence, **evidence}})
        result = judge(evaluation.gate, measurement, host=inp.spec.host)
        return CheckpointEvaluated(step=step, result=result.model_copy(update={"lease": inp.lease}))

    @activity.defn(name=DEPLOY_CHECKPOINT.name)
    @maps_errors
    async def deploy_checkpoint(self, inp: DeploymentInput) -> DeploymentResult:
        """Switch the serving preset to the approved checkpoint: one commit in the serving-config repository."""
        return await asyncio.to_thread(deploy, inp)


def _invalid(inp: EvaluationInput, reason: str, evidence: dict[str, str] | None = None) -> GateResult:
    assert inp.spec.evaluation is not None
    gate = inp.spec.evaluation.gate
    return GateResult(
        gate=gate.name,
        metric=gate.metric,
        verdict=Verdict.INVALID,
        reason=reason,
        rule=gate.describe(),
        method="command",
        host=inp.spec.host,
        evidence=evidence or {},
        gate_spec=gate,
        lease=inp.lease,
    )
