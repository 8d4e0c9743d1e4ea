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

    @property
    def workflow_id(self) -> str:
        return training_workflow_id(self.name)

    def resolved_against(self, base: Path) -> TrainingRunSpec:
        """The run with its relative working, checkpoint, state and artifact directories made absolute."""

        def absolute(path: Path) -> Path:
            return path if path.is_absolute() else (base / path.expanduser()).resolve()

        checkpoints = self.checkpoints.model_copy(update={"directory": absolute(self.checkpoints.directory)})
        return self.model_copy(
            update={
                "cwd": absolute(self.cwd),
                "checkpoints": checkpoints,
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


class SuperviseInput(Model):
    """One segment of supervision: start (or attach to) incarnation `incarnation` and watch it for a while."""

    spec: TrainingRunSpec
    incarnation: int = Field(ge=1)
    stop_requested: bool = False
    resume_from: str | None = None
    filing: str = Field(
        default="", description="the workflow's first run id: a run name started again gets fresh state"
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
