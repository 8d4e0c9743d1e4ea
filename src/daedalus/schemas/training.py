"""Training runs: the run as filed, its watchdog policy, its deaths, and its status as it lives."""

from __future__ import annotations

import signal
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from daedalus.decisions.schemas import Decision, DecisionRequest, DeskState, DispatchRule
from daedalus.ids import training_workflow_id
from daedalus.schemas._base import Model, SpecModel
from daedalus.schemas.audit import TrailState
from daedalus.schemas.gates import GateResult, GateSpec, LeaseRecord, Verdict
from daedalus.schemas.limits import DURATION_MAX_S, HOST_PATTERN, LIST_ITEMS, Line
from daedalus.schemas.ticket import AgentName, ApprovalPolicy, EngineRef

RUN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$"
GIB = 1024**3
MIB = 1024**2

CHECKPOINT_MARKER = "COMPLETE"
"""A checkpoint directory counts only once it holds this file, which the trainer writes last."""


class MemorySource(StrEnum):
    """Which reading the watchdog compares with the threshold."""

    HOST = "host"
    """Host-wide MemAvailable (psutil). The production reading: on unified-memory hosts cgroups and RSS do not
    see GPU allocations, MemAvailable does."""
    PROCESS_TREE = "process_tree"
    """`budget_mib` minus the RSS of the trainer's process tree: hermetic, for tests and shared machines."""
    CGROUP = "cgroup"
    """`memory_limit_mib` minus the usage of the trainer's own memory cgroup (what the kernel's OOM killer of
    that cgroup counts): for a run given a memory limit of its own."""


PSI_TRIGGER_PATTERN = r"^(some|full) [1-9][0-9]{0,8} [1-9][0-9]{0,8}$"


class WatchdogPolicy(SpecModel):
    """When the watchdog stops a run, and how. Defaults are the seed's guard rails (MEASUREMENT.md)."""

    memory_source: MemorySource = MemorySource.HOST
    budget_mib: int | None = Field(
        default=None, gt=0, le=2**40, description="process_tree only: the trainer's budget"
    )
    sample_interval_s: float = Field(default=1.0, ge=0.01, le=60)
    min_available_gib: float = Field(default=14.0, gt=0, description="stop when available drops below this")
    consecutive_samples: int = Field(default=2, ge=1, le=600)
    slope_window_s: float = Field(
        default=900.0, gt=0, le=DURATION_MAX_S, description="the leak fit looks this far back"
    )
    min_fit_span_s: float = Field(
        default=120.0, gt=0, le=DURATION_MAX_S, description="no slope before this much history"
    )
    leak_flag_gib_per_h: float = Field(default=2.0, gt=0, description="flag a leak at least this fast")
    projection_horizon_s: float = Field(
        default=0.0,
        ge=0,
        le=DURATION_MAX_S,
        description="stop early when the threshold is projected within this; 0 = off",
    )
    checkpoint_signal: str = Field(default="SIGUSR1", pattern=r"^SIG[A-Z0-9]+$")
    checkpoint_grace_s: float = Field(default=60.0, ge=0, le=DURATION_MAX_S)
    term_grace_s: float = Field(default=30.0, ge=0, le=DURATION_MAX_S)
    oom_score_adj: int = Field(default=800, ge=-1000, le=1000)
    memory_limit_mib: int | None = Field(
        default=None,
        gt=0,
        le=2**40,
        description="run the trainer in a memory cgroup of its own with this limit (cgroup v1's memory "
        "controller, or a delegated cgroup v2 directory): the kernel's OOM killer then acts inside it, never on "
        "the host's other processes; None = no cgroup of its own",
    )
    memory_events: bool = Field(
        default=True,
        description="also wake between samples on the kernel's memory notifications (the trainer cgroup's "
        "usage crossing the threshold, a PSI trigger); False = sample on the interval only",
    )
    psi_trigger: str = Field(
        default="some 150000 1000000",
        pattern=PSI_TRIGGER_PATTERN,
        description="the PSI trigger written to /proc/pressure/memory (as systemd-oomd does): stall "
        "microseconds in a window of microseconds; without CAP_SYS_RESOURCE the kernel accepts only 2 s windows, "
        "and the watchdog then scales it to one",
    )
    confirm_interval_s: float | None = Field(
        default=None,
        ge=0.01,
        le=60,
        description="after a sample below the threshold (or a kernel notification), take the next one this "
        "soon, so N consecutive samples do not take N intervals; None = sample_interval_s",
    )
    report_interval_s: float = Field(
        default=30.0,
        gt=0,
        le=DURATION_MAX_S,
        description="how often the watchdog reports to the workflow (one activity segment)",
    )

    @field_validator("checkpoint_signal")
    @classmethod
    def _known_signal(cls, name: str) -> str:
        if not hasattr(signal, name):
            raise ValueError(f"unknown signal {name!r}; use a name such as SIGUSR1 or SIGUSR2")
        return name

    @model_validator(mode="after")
    def _consistent(self) -> WatchdogPolicy:
        if self.memory_source is MemorySource.PROCESS_TREE and self.budget_mib is None:
            raise ValueError("memory_source 'process_tree' needs budget_mib (the trainer's memory budget)")
        if self.memory_source is MemorySource.CGROUP and self.memory_limit_mib is None:
            raise ValueError(
                "memory_source 'cgroup' needs memory_limit_mib (the limit of the trainer's cgroup)"
            )
        if (
            self.memory_source is MemorySource.CGROUP
            and self.memory_limit_mib is not None
            and self.min_available_gib * 1024 >= self.memory_limit_mib
        ):
            raise ValueError(
                f"min_available_gib {self.min_available_gib} GiB is not below memory_limit_mib "
                f"{self.memory_limit_mib} MiB: the run would be stopped at once; lower the threshold or raise the limit"
            )
        if self.budget_mib is not None and self.min_available_gib * 1024 >= self.budget_mib:
            raise ValueError(
                f"min_available_gib {self.min_available_gib} GiB is not below budget_mib {self.budget_mib} MiB: "
                "the run would be stopped at once; lower the threshold or raise the budget"
            )
        if self.min_fit_span_s > self.slope_window_s:
            raise ValueError(
                f"min_fit_span_s {self.min_fit_span_s} exceeds slope_window_s {self.slope_window_s}"
            )
        return self

    @property
    def threshold_bytes(self) -> int:
        return int(self.min_available_gib * GIB)

    @property
    def confirm_s(self) -> float:
        """How soon the sample after one below the threshold comes."""
        return self.confirm_interval_s if self.confirm_interval_s is not None else self.sample_interval_s


class CheckpointPolicy(SpecModel):
    """Where the trainer writes checkpoints and how many complete ones to keep."""

    directory: Path
    every_steps: int = Field(
        default=10, ge=1, description="passed to the trainer as DAEDALUS_CHECKPOINT_EVERY"
    )
    keep: int = Field(default=2, ge=1, le=1000, description="keep the latest K complete checkpoints")
    marker: str = Field(
        default=CHECKPOINT_MARKER,
        pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$",
        description="the file (a plain name, written last) that makes a checkpoint directory complete",
    )

    def describe(self) -> str:
        """What an approval shows of the checkpoints: where, how often, and what Daedalus deletes."""
        return (
            f"writes checkpoints under {self.directory} every {self.every_steps} steps; a checkpoint counts once "
            f"its subdirectory holds the file {self.marker!r}; Daedalus deletes complete checkpoints this run "
            f"wrote beyond the newest {self.keep} (never a subdirectory that was there before the run started)"
        )


class RestartPolicy(SpecModel):
    """What happens after a death, and when the death counter starts again."""

    restart: bool = True
    restart_delay_s: float = Field(default=10.0, ge=0, le=DURATION_MAX_S)
    escalate_after_deaths: int = Field(default=3, ge=1, le=20)
    reset_after_stable_s: float | None = Field(
        default=None,
        gt=0,
        le=DURATION_MAX_S,
        description="an incarnation that lives this long resets the death counter; None = only the decider does",
    )


class HuntPolicy(SpecModel):
    """Who hunts a repeating death, and where."""

    agent: AgentName = AgentName.CODEX
    model: str | None = None
    repo: str | None = Field(
        default=None, description="superseded by `engine`; kept so filed runs still load"
    )
    engine: EngineRef | None = Field(
        default=None,
        description="the repository the hunting agent works in (the trainer's, or the engine fork it drives); "
        "without it the hunting ticket can be filed and approved, but its attempt has no checkout to work in",
    )


DOTTED_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*){0,7}$"
BRANCH_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$"


class DeploymentPolicy(SpecModel):
    """Where a checkpoint that clears the evaluation's bar goes once a decider approves: one value of a serving
    preset in a serving-config git repository, changed by a commit the host makes (trailer
    `Daedalus-Deployment: <request id>`, so a retried deployment never commits twice)."""

    repo: Path = Field(description="the serving-config repository's working tree on the host")
    preset: str = Field(
        min_length=1, max_length=255, description="the preset file, relative to the repository's root"
    )
    key: str = Field(
        default="speculative.model",
        pattern=DOTTED_KEY_PATTERN,
        description="the preset's field the checkpoint goes into, dotted (`speculative.model`, `draft.model`)",
    )
    value: Line = Field(
        default="{checkpoint}",
        min_length=1,
        description="what the field is set to; {checkpoint}, {step} and {run} are filled in",
    )
    branch: str | None = Field(
        default=None, pattern=BRANCH_PATTERN, description="the branch that must be checked out; None = any"
    )
    host: str | None = Field(
        default=None, pattern=HOST_PATTERN, description="the host whose checkout it is; None = the run's host"
    )

    @field_validator("preset")
    @classmethod
    def _inside_the_repository(cls, preset: str) -> str:
        parts = Path(preset).parts
        if Path(preset).is_absolute() or ".." in parts or not parts:
            raise ValueError(
                f"preset {preset!r} must be a path inside the repository (relative, without '..')"
            )
        return preset

    def filled(self, *, checkpoint: str, step: int | None, run: str) -> str:
        """The value with its placeholders filled in."""
        return (
            self.value.replace("{checkpoint}", checkpoint)
            .replace("{step}", "" if step is None else str(step))
            .replace("{run}", run)
        )


class EvaluationPolicy(SpecModel):
    """What is measured of every complete checkpoint, and the bar it must clear: a gate whose command prints one
    `GateMeasurement` line (`kind: ab` for a drafter's acceptance length against a baseline), run on the run's
    host confined as a ticket's gate is, with `DAEDALUS_CHECKPOINT` naming the checkpoint's directory (read-only)
    and `DAEDALUS_CHECKPOINT_STEP` its step."""

    gate: GateSpec
    deploy: DeploymentPolicy | None = Field(
        default=None, description="propose a checkpoint that clears the bar for this serving preset"
    )
    max_waiting: int = Field(
        default=2,
        ge=1,
        le=20,
        description="checkpoints kept waiting for their evaluation (never pruned meanwhile), besides the one "
        "being evaluated; when more come, the oldest waiting are skipped, and the next evaluation names them",
    )

    def describe(self) -> str:
        deploy = (
            f"; a checkpoint that clears it (and beats every one proposed before) is proposed for "
            f"{self.deploy.preset} in {self.deploy.repo} ({self.deploy.key}), changed by a commit once a decider "
            f"approves"
            if self.deploy is not None
            else ""
        )
        return f"evaluates every complete checkpoint confined: {self.gate.command!r}, bar {self.gate.describe()}{deploy}"


class TrainingRunSpec(SpecModel):
    """A training run as filed (`daedalus train start -f run.yaml`)."""

    name: str = Field(pattern=RUN_NAME_PATTERN)
    host: str = Field(min_length=1, pattern=HOST_PATTERN)
    command: list[Line] = Field(min_length=1, max_length=LIST_ITEMS)
    cwd: Path = Path(".")
    env: dict[str, Line] = Field(default_factory=dict, max_length=LIST_ITEMS)
    checkpoints: CheckpointPolicy
    watchdog: WatchdogPolicy = Field(default_factory=WatchdogPolicy)
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    hunt: HuntPolicy = Field(default_factory=HuntPolicy)
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    state_dir: Path | None = Field(
        default=None, description="pidfiles and curves; default <artifact dir>/training"
    )
    artifact_dir: Path | None = Field(
        default=None, description="default: the host worker's artifact directory (DAEDALUS_ARTIFACTS)"
    )
    history_limit: int = Field(
        default=2000, ge=100, le=9000, description="continue-as-new past this many events"
    )
    target_steps: int | None = Field(
        default=None,
        ge=1,
        le=10**12,
        description="the step the run trains to: the ETA is to it (passed to the trainer as DAEDALUS_TARGET_STEPS)",
    )
    progress_window_s: float = Field(
        default=120.0, gt=0, le=DURATION_MAX_S, description="throughput is measured over this much progress"
    )
    evaluation: EvaluationPolicy | None = Field(
        default=None, description="measure every complete checkpoint, and propose the ones that clear a bar"
    )

    @property
    def workflow_id(self) -> str:
        return training_workflow_id(self.name)

    def resolved_against(self, base: Path) -> TrainingRunSpec:
        """The run with its relative working, checkpoint, state and artifact directories made absolute."""

        def absolute(path: Path) -> Path:
            return path if path.is_absolute() else (base / path.expanduser()).resolve()

        checkpoints = self.checkpoints.model_copy(update={"directory": absolute(self.checkpoints.directory)})
        evaluation = self.evaluation
        if evaluation is not None and evaluation.deploy is not None:
            deploy = evaluation.deploy.model_copy(update={"repo": absolute(evaluation.deploy.repo)})
            evaluation = evaluation.model_copy(update={"deploy": deploy})
        return self.model_copy(
            update={
                "cwd": absolute(self.cwd),
                "checkpoints": checkpoints,
                "evaluation": evaluation,
                "state_dir": absolute(self.state_dir) if self.state_dir is not None else None,
                "artifact_dir": absolute(self.artifact_dir) if self.artifact_dir is not None else None,
            }
        )

    def effects(self) -> list[str]:
        """Everything the run will do on its host, as its dispatch request lists it for the decider."""
        lines = [f"runs on {self.host} in {self.cwd}: {' '.join(self.command)}"]
        if self.env:
            lines.append(f"with environment variables: {', '.join(sorted(self.env))}")
        lines.append(self.checkpoints.describe())
        lines.append(
            f"keeps its state (pidfiles, memory curve) under {self.state_dir or 'the worker state directory'}"
        )
        lines.append(
            f"keeps its artifacts (logs, deaths) under {self.artifact_dir or 'the worker artifact directory'}"
        )
        if self.restart.restart:
            lines.append(
                f"restarts the trainer after a death; the {self.restart.escalate_after_deaths}th death escalates "
                f"and opens a hunting ticket for {self.hunt.agent.value}"
            )
        if self.watchdog.memory_limit_mib is not None:
            lines.append(
                f"runs the trainer in a memory cgroup of its own, limited to {self.watchdog.memory_limit_mib} MiB"
            )
        if self.evaluation is not None:
            lines.append(self.evaluation.describe())
        return lines


class DeathClass(StrEnum):
    KERNEL_OOM = "kernel_oom"
    """SIGKILL by the kernel's OOM killer, with evidence: an oom_kill counter moved (/proc/vmstat, the memory
    cgroup's memory.events) or the kernel log names the trainer."""
    OUTSIDE_SIGKILL = "outside_sigkill"
    """SIGKILL from outside, sender unknown: not ours, and no OOM evidence."""
    OUTSIDE_SIGTERM = "outside_sigterm"
    """SIGTERM from someone else (earlyoom, systemd-oomd, a person)."""
    OUTSIDE_SIGNAL = "outside_signal"
    """Another signal from someone else."""
    WATCHDOG_STOP = "watchdog_stop"
    """Our graceful stop: memory below the threshold, or projected to be."""
    REQUESTED_STOP = "requested_stop"
    """Our graceful stop, asked for by a person (`train stop`)."""
    CLEAN_EXIT = "clean_exit"
    CRASH = "crash"
    """A non-zero exit code."""
    LOST = "lost"
    """The exit status could not be recovered (the supervisor vanished with the trainer)."""


COUNTED_DEATHS = frozenset(
    {
        DeathClass.KERNEL_OOM,
        DeathClass.OUTSIDE_SIGKILL,
        DeathClass.OUTSIDE_SIGTERM,
        DeathClass.OUTSIDE_SIGNAL,
        DeathClass.WATCHDOG_STOP,
        DeathClass.CRASH,
        DeathClass.LOST,
    }
)


class StopReason(StrEnum):
    THRESHOLD = "threshold"
    PROJECTED = "projected"
    REQUESTED = "requested"
    CANCELLED = "cancelled"


class MemoryReading(Model):
    """One sample as the status shows it."""

    at: datetime
    available_bytes: int
    psi_some_avg10: float | None = None
    gpu_used_bytes: int | None = None
    gpu_util_pct: int | None = Field(default=None, description="NVML utilisation, mean over the host's GPUs")

    @property
    def available_gib(self) -> float:
        return self.available_bytes / GIB


def format_duration(seconds: float) -> str:
    """A duration as a person reads it: `45 s`, `6 min 5 s`, `3 h 12 min`, `2 d 4 h`."""
    total = max(0, round(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


class ProgressReading(Model):
    """How far the trainer is, from what it writes to `DAEDALUS_PROGRESS_FILE` (`{"step": N, "tokens": T}`),
    with its throughput over the run's progress window and the ETA to its target steps at that throughput."""

    at: datetime = Field(description="when the trainer last wrote its progress")
    step: int = Field(ge=0)
    target_steps: int | None = None
    steps_per_s: float | None = Field(default=None, description="steps over the window / its span")
    tokens_per_s: float | None = Field(default=None, description="when the trainer counts tokens")
    window_s: float | None = Field(default=None, description="the span the throughput was measured over")
    eta_s: float | None = Field(default=None, description="(target - step) / steps_per_s; None without both")

    def summary(self) -> str:
        """`step 120 / 300 (40%), 2.41 steps/s (1,234 tok/s) over 60 s, ETA 1 min 15 s`."""
        parts = [f"step {self.step:,}"]
        if self.target_steps:
            parts[0] += f" / {self.target_steps:,} ({100 * self.step / self.target_steps:.0f}%)"
        if self.steps_per_s is not None:
            rate = f"{self.steps_per_s:.3g} steps/s"
            if self.tokens_per_s is not None:
                rate += f" ({self.tokens_per_s:,.0f} tok/s)"
            if self.window_s is not None:
                rate += f" over {format_duration(self.window_s)}"
            parts.append(rate)
        if self.eta_s is not None:
            parts.append(f"ETA {format_duration(self.eta_s)}")
        elif self.target_steps and self.step >= self.target_steps:
            parts.append("target reached")
        return ", ".join(parts)


class CheckpointEvaluation(Model):
    """One complete checkpoint's evaluation, as the run keeps it (the whole verdict, samples and rule included, is
    in the audit store's verdicts, so it can be re-derived there)."""

    checkpoint: str
    step: int | None = None
    verdict: Verdict
    rule: str
    reason: str
    score: float | None = Field(default=None, description="the candidate's median of the metric")
    baseline: float | None = Field(default=None, description="the baseline's median, for an A/B bar")
    median: float | None = Field(default=None, description="the judged median (the ratio, for an A/B bar)")
    ci_low: float | None = None
    ci_high: float | None = None
    unit: str = ""
    at: datetime
    skipped: list[str] = Field(
        default_factory=list, description="checkpoints that waited and were skipped for this newer one"
    )

    @property
    def clears(self) -> bool:
        return self.verdict is Verdict.PASS

    @property
    def name(self) -> str:
        return Path(self.checkpoint).name

    def summary(self) -> str:
        """`ckpt-0000040 (step 40): PASS, 4.31 vs baseline 1.62 tokens/step, ratio 2.66 [2.50, 2.81]: rule ...`."""
        step = f" (step {self.step})" if self.step is not None else ""
        unit = f" {self.unit}" if self.unit else ""
        measured = ""
        if self.score is not None:
            measured = f", {self.score:.3g}{unit}"
            if self.baseline is not None:
                measured = f", {self.score:.3g} vs baseline {self.baseline:.3g}{unit}"
        judged = ""
        if self.median is not None and self.ci_low is not None and self.ci_high is not None:
            what = "ratio " if self.baseline is not None else "median "
            judged = f", {what}{self.median:.3g} [{self.ci_low:.3g}, {self.ci_high:.3g}]"
        return f"{self.name}{step}: {self.verdict.value}{measured}{judged} ({self.rule})"


class DeploymentOutcome(StrEnum):
    DEPLOYED = "deployed"
    """Approved, and the preset's change committed."""
    SKIPPED = "skipped"
    """The decider chose not to deploy it."""
    FAILED = "failed"
    """Approved, but the commit could not be made (the reason says why)."""
    WITHDRAWN = "withdrawn"
    """The request was withdrawn before an answer (the run stopped, or escalated: then it is asked again)."""


class Deployment(Model):
    """What became of one checkpoint proposed for a serving preset."""

    checkpoint: str
    step: int | None = None
    score: float | None = None
    request_id: str | None = None
    outcome: DeploymentOutcome
    decided_by: str | None = None
    commit: str | None = None
    repo: str
    preset: str
    key: str
    value: str | None = None
    previous: str | None = None
    at: datetime
    summary: str


class DeploymentInput(Model):
    """The host's step after an approval: set the preset's field and commit it."""

    run: str
    policy: DeploymentPolicy
    checkpoint: str
    step: int | None = None
    request_id: str
    decided_by: str
    evaluation: str = Field(description="the evaluation's one-line summary, for the commit message")


class DeploymentResult(Model):
    commit: str
    file: str
    key: str
    value: str
    previous: str | None = None
    already: bool = Field(default=False, description="an earlier try had already committed it (the trailer)")


class EvaluationInput(Model):
    """Evaluate one complete checkpoint on the run's host."""

    spec: TrainingRunSpec
    checkpoint: str
    step: int | None = None
    filing: str = ""
    lease: LeaseRecord | None = Field(
        default=None, description="the run's GPU lease: the evaluation uses it too"
    )


class CheckpointEvaluated(Model):
    """The host's answer: the checkpoint's step (from its state.json, else its name) and the gate's verdict."""

    step: int | None = None
    result: GateResult


class Death(Model):
    """One incarnation's end, classified, with paths to its evidence (the curve and log tail live on disk)."""

    id: str = Field(description="<run>#<incarnation>: a duplicated report of the same death has the same id")
    incarnation: int = Field(ge=1)
    death_class: DeathClass
    exit_code: int | None = None
    signal: str | None = None
    stop_reason: StopReason | None = None
    started_at: datetime
    ended_at: datetime
    lifetime_s: float
    summary: str
    last_checkpoint: str | None = None
    min_available_gib: float | None = None
    slope_gib_per_h: float | None = None
    oom_kills_during_run: int | None = Field(default=None, description="/proc/vmstat oom_kill delta")
    oom_evidence: list[str] = Field(default_factory=list, description="why a SIGKILL was judged a kernel OOM")
    oom_score_adj: int | None = None
    curve_path: str | None = None
    log_tail_path: str | None = None
    stop_trigger: str | None = Field(
        default=None, description="our stop: what woke the sample that began the run below the threshold"
    )
    cgroup_peak_bytes: int | None = Field(
        default=None, description="the peak usage of the trainer's own memory cgroup, where it had one"
    )
    progress: ProgressReading | None = None


class SuperviseInput(Model):
    """One segment of supervision: start (or attach to) incarnation `incarnation` and watch it for a while."""

    spec: TrainingRunSpec
    incarnation: int = Field(ge=1)
    stop_requested: bool = False
    resume_from: str | None = None
    filing: str = Field(
        default="", description="the workflow's first run id: a run name started again gets fresh state"
    )
    keep: list[str] = Field(
        default_factory=list,
        description="checkpoints the workflow still needs (waiting for evaluation or a deployment decision): "
        "never pruned while listed",
    )


class SegmentReport(Model):
    """What one supervision segment saw; `death` is set when the incarnation ended."""

    incarnation: int
    trainer_pid: int | None = None
    attached: bool = Field(
        default=False, description="True when this segment found the trainer already running"
    )
    started_at: datetime
    samples: int = 0
    memory_now: MemoryReading | None = None
    slope_gib_per_h: float | None = None
    leak_flagged: bool = False
    last_checkpoint: str | None = None
    checkpoints_pruned: list[str] = Field(default_factory=list)
    oom_score_adj: int | None = None
    death: Death | None = None
    progress: ProgressReading | None = None
    checkpoints: list[str] = Field(default_factory=list, description="the complete checkpoints, oldest first")
    wakeups: str | None = Field(
        default=None, description="what wakes the watchdog: the kernel notifications armed, or polling only"
    )


class InvisiblePlayer(Model):
    """Something on the host that may kill or starve a run without being part of it."""

    kind: str = Field(description="earlyoom | systemd-oomd | swapoff-cron")
    source: str = Field(description="pid <n>, or the file it was found in")
    detail: str
    thresholds: dict[str, str] = Field(default_factory=dict)


class HostReport(Model):
    host: str
    players: list[InvisiblePlayer] = Field(default_factory=list)
    swap_total_bytes: int = 0
    swap_used_bytes: int = 0
    mem_total_bytes: int = 0
    psi_available: bool = False
    nvml: str = Field(default="absent", description="absent | ok | not_supported | error: ...")
    notes: list[str] = Field(default_factory=list)

    def summary(self) -> str:
        kinds = ", ".join(f"{p.kind} ({p.source})" for p in self.players) or "none"
        swap = f"swap {self.swap_total_bytes / GIB:.1f} GiB" if self.swap_total_bytes else "no swap"
        return f"invisible players: {kinds}; {swap}"


class HostReportInput(Model):
    host: str
    proc_root: Path = Path("/proc")
    etc_root: Path = Path("/etc")
    crontab_roots: list[Path] = Field(
        default_factory=lambda: [Path("/var/spool/cron/crontabs"), Path("/var/spool/cron")]
    )


class StopTraining(Model):
    requested_by: str = Field(min_length=1)
    reason: str = "stopped by request"


class RunState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    AWAITING_DECISION = "awaiting_decision"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FINISHED = "finished"
    GAVE_UP = "gave_up"


class TrainingCarry(Model):
    """What one workflow run hands the next across continue-as-new."""

    state: RunState = RunState.STARTING
    incarnation: int = 1
    incarnation_started_at: datetime | None = None
    deaths: list[Death] = Field(default_factory=list)
    death_counter: int = 0
    escalations: int = 0
    hunting_tickets: list[str] = Field(default_factory=list)
    stop: StopTraining | None = None
    last_report: SegmentReport | None = None
    host_report: HostReport | None = None
    continued: int = 0
    desk: DeskState | None = Field(
        default=None, description="the decision desk's state; None in older carries"
    )
    trail: TrailState | None = Field(
        default=None, description="the audit trail's state; None in older carries"
    )
    evaluations: list[CheckpointEvaluation] = Field(
        default_factory=list, description="the latest evaluations (all of them are in the audit store)"
    )
    waiting: list[str] = Field(default_factory=list, description="complete checkpoints not evaluated yet")
    seen: list[str] = Field(
        default_factory=list, description="the latest checkpoints evaluated or skipped: never queued again"
    )
    candidate: CheckpointEvaluation | None = Field(
        default=None, description="the best evaluation that cleared the bar and was not proposed yet"
    )
    proposing: CheckpointEvaluation | None = Field(
        default=None, description="the evaluation whose deployment decision is pending"
    )
    proposed_best: float | None = Field(default=None, description="the best score proposed so far")
    deployments: list[Deployment] = Field(default_factory=list, description="the latest deployment outcomes")
    skipped: list[str] = Field(
        default_factory=list, description="waiting checkpoints skipped since the last evaluation"
    )
    # Carries written before the desk and the trail held these; read (never written) by TrainingRunWorkflow.
    pending_decision: DecisionRequest | None = None
    decisions: list[Decision] = Field(default_factory=list)
    audit_seq: int = Field(default=0, ge=0)


class TrainingRunInput(Model):
    """The one argument of TrainingRunWorkflow."""

    spec: TrainingRunSpec
    carry: TrainingCarry = Field(default_factory=TrainingCarry)
    gpus: int = Field(
        default=0,
        ge=0,
        description="the host's GPUs (hosts.yaml, at start): the run holds a lease on them all",
    )
    dispatch: DispatchRule | None = Field(
        default=None,
        description="the server policy's dispatch rule, resolved at start; None: starts at once (no policy)",
    )
    started_by: str = Field(
        default="cli", description="who started the run (kept across continue-as-new); may stop it"
    )


class TrainingRunStatus(Model):
    """The `status` query's answer."""

    name: str
    host: str
    state: RunState
    incarnation: int
    memory_now: MemoryReading | None = None
    slope_gib_per_h: float | None = None
    leak_flagged: bool = False
    last_checkpoint: str | None = None
    trainer_pid: int | None = None
    deaths: list[Death] = Field(default_factory=list)
    death_counter: int = 0
    hunting_tickets: list[str] = Field(default_factory=list)
    pending_decision: DecisionRequest | None = None
    host_report: HostReport | None = None
    started_by: str = Field(default="cli", description="who started the run")
    continued: int = 0
    audit_seq: int = Field(default=0, description="the last audit event the store holds")
    progress: ProgressReading | None = None
    wakeups: str | None = None
    evaluations: list[CheckpointEvaluation] = Field(default_factory=list)
    waiting_evaluation: list[str] = Field(default_factory=list)
    deployments: list[Deployment] = Field(default_factory=list)
