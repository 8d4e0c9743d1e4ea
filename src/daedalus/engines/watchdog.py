"""The training watchdog: start or re-attach to a trainer, sample memory, stop it gracefully, classify its death.

One call of `supervise_segment` watches one incarnation for up to `report_interval_s` and returns what it saw;
the workflow calls it again and again, so every call is also the re-attach path. Everything a later call needs
lives in the incarnation's state dir: `trainer.json`/`exit.json` (the keeper), `stop.json` (our stop, written
before the first signal, so a restarted watchdog still knows a death was ours), `curve.csv` (the samples),
`cgroup.json` (the trainer's own memory cgroup, when the run has a memory limit), `progress.json` (what the
trainer writes of its steps) and `progress.csv` (the steps as the watchdog saw them change).

Between samples the watchdog sleeps on the kernel's memory notifications (engines/pressure.py): a trainer
that allocates gigabytes a second is sampled the moment its cgroup crosses the threshold, not at the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import structlog

from daedalus.engines import trainer_process as tp
from daedalus.engines.memory import (
    MAX_FIT_POINTS,
    MIB,
    MemoryReader,
    Nvml,
    OomCounters,
    SlopeFit,
    TrainerCgroup,
    cgroup_oom_file,
    fit_slope,
    kernel_log_oom,
    oom_counters,
    read_psi_some_avg10,
    reader_for,
)
from daedalus.engines.pressure import PSI_MEMORY, MemoryEvents
from daedalus.errors import TrainingInputError
from daedalus.schemas.training import (
    GIB,
    CheckpointPolicy,
    Death,
    DeathClass,
    MemoryReading,
    MemorySource,
    ProgressReading,
    SegmentReport,
    StopReason,
    SuperviseInput,
    TrainingRunSpec,
    WatchdogPolicy,
)

log = structlog.get_logger(__name__)

STOP_FILE = "stop.json"
DEATH_FILE = "death.json"
CURVE_FILE = "curve.csv"
OOM_BASELINE_FILE = "oom_kills.start"
PROGRESS_FILE = "progress.json"
PROGRESS_LOG = "progress.csv"
LOG_TAIL_BYTES = 16_000
LAUNCH_WAIT_S = 15.0
CURVE_LINE_BYTES = 64
"""A curve line is at most ~55 bytes (`t,available,psi,gpu_used,gpu_util`)."""
STOP_POLL_S = 0.02
"""While stopping: how often the watchdog looks for the checkpoint it asked for (then SIGTERM at once)."""
SPURIOUS_WAKEUPS = 100
"""Readiness with nothing to drain this many times in a row: the notifications are dropped for polling."""

Heartbeat = Callable[[dict[str, object]], None]


# --- checkpoints -------------------------------------------------------------------------------------------


PREEXISTING_FILE = "checkpoints-before.json"
"""What the checkpoint directory held when the run first started: never the run's to prune."""


def complete_checkpoints(policy: CheckpointPolicy, spare: frozenset[str] = frozenset()) -> list[Path]:
    """Checkpoint dirs holding the marker file, oldest first (by the marker's mtime: it is written last);
    entries named in `spare` (there before the run) are not the run's checkpoints."""
    found: list[tuple[int, str, Path]] = []
    try:
        entries = list(policy.directory.iterdir())
    except OSError:
        return []
    for entry in entries:
        if entry.name.startswith(".") or entry.name in spare or entry.is_symlink() or not entry.is_dir():
            continue
        marker = entry / policy.marker
        with contextlib.suppress(OSError):
            if marker.is_file() and not marker.is_symlink():
                found.append((marker.stat().st_mtime_ns, entry.name, entry))
    return [p for _, _, p in sorted(found)]


def record_preexisting(policy: CheckpointPolicy, path: Path) -> frozenset[str]:
    """Note (once per start of the run) what the checkpoint directory already holds; returns it."""
    if not path.exists():
        try:
            names = sorted(entry.name for entry in policy.directory.iterdir())
        except OSError:
            names = []
        path.write_text(json.dumps(names))
    return frozenset(json.loads(path.read_text()))


def latest_checkpoint(policy: CheckpointPolicy) -> Path | None:
    done = complete_checkpoints(policy)
    return done[-1] if done else None


def prune_checkpoints(policy: CheckpointPolicy, spare: frozenset[str] = frozenset()) -> list[Path]:
    """Keep the latest `keep` complete checkpoints; remove older complete ones and any half-written one older
    than the newest complete (it can never be finished). A half-written one newer than that may be in
    progress, so it stays — but it never counts as one of the kept. Nothing named in `spare` is touched."""
    done = complete_checkpoints(policy, spare)
    if not done:
        return []
    newest_mtime = (done[-1] / policy.marker).stat().st_mtime_ns
    doomed = done[: -policy.keep] if len(done) > policy.keep else []
    keep = set(done[-policy.keep :])
    for entry in policy.directory.iterdir():
        if entry.name.startswith(".") or entry.name in spare or entry.is_symlink() or not entry.is_dir():
            continue
        if entry in keep or entry in doomed:
            continue
        if (entry / policy.marker).exists():
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_mtime_ns < newest_mtime:
                doomed.append(entry)
    removed: list[Path] = []
    for path in doomed:
        # Rename first: a reader never sees a checkpoint half-deleted under its real name.
        hidden = path.with_name(f".pruning-{path.name}")
        try:
            os.replace(path, hidden)
        except OSError:
            continue
        shutil.rmtree(hidden, ignore_errors=True)
        removed.append(path)
    return removed


# --- the stop rule -----------------------------------------------------------------------------------------


@dataclass
class StopRule:
    """Threshold on N consecutive samples; optionally a projected crossing within the horizon."""

    policy: WatchdogPolicy
    consecutive: int = 0
    times: deque[float] = field(default_factory=deque)
    values: deque[int] = field(default_factory=deque)
    fit: SlopeFit | None = None
    _last_fit_t: float = float("-inf")

    def observe(self, t: float, available: int, fit: bool = True) -> StopReason | None:
        """One sample; `fit=False` (refilling from the curve on disk) leaves the slope for one `refit` after."""
        self.times.append(t)
        self.values.append(available)
        while self.times and self.times[0] < t - self.policy.slope_window_s:
            self.times.popleft()
            self.values.popleft()
        self.consecutive = self.consecutive + 1 if available < self.policy.threshold_bytes else 0
        if self.consecutive >= self.policy.consecutive_samples:
            return StopReason.THRESHOLD
        # Refit once per fit bucket (>= 1 s): a fit per sample would be most of the watchdog's cost at 10 Hz.
        if fit and t - self._last_fit_t >= max(1.0, self.policy.slope_window_s / MAX_FIT_POINTS / 2):
            self.refit(t)
        if self.policy.projection_horizon_s > 0 and self.fit is not None:
            # The slope interval's end nearest zero: project with the slowest leak the data allows.
            slow = self.fit.high_gib_per_h
            if slow < 0:
                headroom_gib = (available - self.policy.threshold_bytes) / GIB
                if headroom_gib / -slow * 3600.0 <= self.policy.projection_horizon_s:
                    return StopReason.PROJECTED
        return None

    def refit(self, t: float) -> None:
        self.fit = fit_slope(list(self.times), list(self.values), self.policy.min_fit_span_s)
        self._last_fit_t = t

    @property
    def leak_flagged(self) -> bool:
        return self.fit is not None and self.fit.leak_lower_bound_gib_per_h >= self.policy.leak_flag_gib_per_h


# --- the curve ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float
    available: int
    psi: float | None
    gpu_used: int | None
    gpu_util: int | None = None
    """NVML utilisation %, summed over the host's GPUs' readings divided by their count."""


def append_sample(path: Path, sample: Sample) -> None:
    with path.open("a") as handle:
        psi = "" if sample.psi is None else f"{sample.psi:.2f}"
        gpu = "" if sample.gpu_used is None else str(sample.gpu_used)
        util = "" if sample.gpu_util is None else str(sample.gpu_util)
        handle.write(f"{sample.t:.3f},{sample.available},{psi},{gpu},{util}\n")


def read_curve(path: Path, tail_bytes: int | None = None) -> Iterator[Sample]:
    """The samples on disk; with `tail_bytes`, only those in the file's last that many bytes (a long run's curve
    grows by a line a second: a re-attached watchdog reads its window, not its days)."""
    try:
        handle = path.open()
    except OSError:
        return
    with handle:
        if tail_bytes is not None:
            size = handle.seek(0, os.SEEK_END)
            if size > tail_bytes:
                handle.seek(size - tail_bytes)
                handle.readline()  # the line the seek landed in
            else:
                handle.seek(0)
        for row in csv.reader(handle):
            if len(row) not in (4, 5):  # 4: curves written before GPU utilisation was sampled
                continue  # a line torn by a kill mid-write
            try:
                yield Sample(
                    float(row[0]),
                    int(row[1]),
                    float(row[2]) if row[2] else None,
                    int(row[3]) if row[3] else None,
                    int(row[4]) if len(row) == 5 and row[4] else None,
                )
            except ValueError:
                continue


# --- progress ----------------------------------------------------------------------------------------------


@dataclass
class ProgressTracker:
    """Steps and throughput from what the trainer writes to `DAEDALUS_PROGRESS_FILE` (`{"step": N}`, optionally
    `"tokens": T`, rewritten whole as it goes). Each change is appended to the progress log, so a re-attached
    watchdog keeps its window; the throughput is the change over the window's points, the ETA the steps left at it."""

    path: Path
    log: Path
    window_s: float
    target: int | None
    points: deque[tuple[float, int, int | None]] = field(default_factory=deque)
    _seen_ns: int = -1

    def restore(self) -> None:
        try:
            lines = self.log.read_text().splitlines()
        except OSError:
            return
        for line in lines:
            parts = line.split(",")
            with contextlib.suppress(ValueError, IndexError):
                tokens = int(parts[2]) if parts[2] else None
                self._add(float(parts[0]), int(parts[1]), tokens)

    def read(self) -> ProgressReading | None:
        """The trainer's progress now (None before it wrote any); a stat when nothing changed."""
        try:
            stat = self.path.stat()
        except OSError:
            return self.reading()
        if stat.st_mtime_ns != self._seen_ns:
            self._seen_ns = stat.st_mtime_ns
            try:
                data = json.loads(self.path.read_text())
                step = int(data["step"])
                tokens = int(data["tokens"]) if data.get("tokens") is not None else None
            except (OSError, ValueError, KeyError, TypeError):
                return self.reading()  # torn or odd: keep what we had
            if step >= 0 and (not self.points or step != self.points[-1][1]):
                at = stat.st_mtime_ns / 1e9
                self._add(at, step, tokens)
                with self.log.open("a") as handle:
                    handle.write(f"{at:.3f},{step},{'' if tokens is None else tokens}\n")
        return self.reading()

    def _add(self, at: float, step: int, tokens: int | None) -> None:
        if self.points and step < self.points[-1][1]:
            self.points.clear()  # a step count that went back: a new count, not negative throughput
        self.points.append((at, step, tokens))
        while len(self.points) > 2 and self.points[1][0] <= at - self.window_s:
            self.points.popleft()

    def reading(self) -> ProgressReading | None:
        if not self.points:
            return None
        at, step, tokens = self.points[-1]
        first_at, first_step, first_tokens = self.points[0]
        span = at - first_at
        rate = (step - first_step) / span if span > 0 else None
        token_rate = (
            (tokens - first_tokens) / span
            if span > 0 and tokens is not None and first_tokens is not None
            else None
        )
        eta = None
        if self.target is not None and rate and step < self.target:
            eta = (self.target - step) / rate
        return ProgressReading(
            at=datetime.fromtimestamp(at, UTC),
            step=step,
            target_steps=self.target,
            steps_per_s=rate,
            tokens_per_s=token_rate,
            window_s=span if span > 0 else None,
            eta_s=eta,
        )


# --- waking ------------------------------------------------------------------------------------------------


class Waker:
    """Sleep until the next sample is due or a kernel notification fires, whichever is first. The notifications'
    epoll descriptor is watched by the event loop itself: nothing runs between them but the samples."""

    def __init__(self, events: MemoryEvents | None):
        self.events = events if events is not None and events.armed else None
        self.fired: list[str] = []
        self._flag = asyncio.Event()
        self._spurious = 0
        self._loop = asyncio.get_running_loop()
        if self.events is not None:
            self._loop.add_reader(self.events.fileno(), self._readable)

    def _readable(self) -> None:
        assert self.events is not None
        names = self.events.drain()
        if names:
            self._spurious = 0
            self.fired += names
            self._flag.set()
            return
        self._spurious += 1
        if self._spurious >= SPURIOUS_WAKEUPS:
            log.warning("memory notifications keep waking with nothing to read: polling instead")
            self._loop.remove_reader(self.events.fileno())

    async def wait(self, timeout_s: float) -> list[str]:
        """The notifications that fired while waiting (empty: the timeout came first)."""
        if not self._flag.is_set() and timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flag.wait(), timeout_s)
        fired, self.fired = self.fired, []
        self._flag.clear()
        return fired

    def close(self) -> None:
        if self.events is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self.events.fileno())
            self.events.close()


def arm_events(policy: WatchdogPolicy, cgroup: TrainerCgroup | None, psi: Path = PSI_MEMORY) -> MemoryEvents:
    """The kernel notifications this run's memory reading can use (see engines/pressure.py)."""
    events = MemoryEvents()
    if not policy.memory_events:
        events.refused.append("memory_events is off in the run's watchdog policy")
        return events
    if cgroup is not None and policy.memory_source is MemorySource.CGROUP:
        usage = cgroup.limit_bytes - policy.threshold_bytes
        if cgroup.unified:
            with contextlib.suppress(OSError):  # the throttle is a help, the notification the point
                (cgroup.path / "memory.high").write_text(str(usage))
            events.add_v2_events(cgroup.path)
            events.add_psi(cgroup.path / "memory.pressure", policy.psi_trigger, f"({cgroup.path.name})")
        else:
            events.add_v1_threshold(cgroup.path, usage)
            events.add_v1_pressure_level(cgroup.path)
            events.add_psi(psi, policy.psi_trigger, "(host-wide)")
    else:
        events.add_psi(psi, policy.psi_trigger, "(host-wide)")
    return events


# --- supervision -------------------------------------------------------------------------------------------


def run_dir_for(state_root: Path, spec: TrainingRunSpec, incarnation: int, filing: str = "") -> Path:
    """Per start of the run name (`filing`), so a run started again never attaches to an earlier one's state."""
    return state_root / spec.name / filing / f"incarnation-{incarnation:04d}"


def artifact_dir_for(artifact_root: Path, spec: TrainingRunSpec, incarnation: int, filing: str = "") -> Path:
    return artifact_root / "training" / spec.name / filing / f"incarnation-{incarnation:04d}"


def validate_spec(spec: TrainingRunSpec) -> None:
    """Everything that can be checked on the host before a trainer starts; raises TrainingInputError."""
    cwd = spec.cwd.expanduser()
    if not cwd.is_dir():
        raise TrainingInputError(f"the run's working directory {cwd} does not exist")
    tp.resolve_command(spec.command, cwd, spec.env)
    tp.check_writable_dir(spec.checkpoints.directory, "checkpoint directory")
    total = _mem_total()
    if spec.watchdog.budget_mib is None and spec.watchdog.threshold_bytes >= total:
        raise TrainingInputError(
            f"min_available_gib {spec.watchdog.min_available_gib} is at or above this host's total memory "
            f"({total / GIB:.1f} GiB): the run would be stopped at once"
        )


def _mem_total() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[bool]:
    """Try the incarnation's lock without blocking; the kernel drops it when its holder dies (even SIGKILL)."""
    handle = path.open("a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        handle.close()


class Supervisor:
    """One segment's work. Built per call; everything durable is in `run_dir`."""

    def __init__(
        self,
        inp: SuperviseInput,
        *,
        state_root: Path,
        artifact_root: Path,
        heartbeat: Heartbeat,
        resume: dict[str, object] | None = None,
        cgroup_root: Path | None = None,
    ):
        self.inp = inp
        self.cgroup_root = cgroup_root
        self.cgroup: TrainerCgroup | None = None
        self.spec = inp.spec
        self.policy = inp.spec.watchdog
        self.run_dir = run_dir_for(state_root, self.spec, inp.incarnation, inp.filing)
        self.preexisting_file = self.run_dir.parent / PREEXISTING_FILE
        self.preexisting: frozenset[str] | None = None
        self.artifact_dir = artifact_dir_for(artifact_root, self.spec, inp.incarnation, inp.filing)
        self.heartbeat = heartbeat
        self.resume = resume or {}
        self.rule = StopRule(self.policy)
        self.samples = 0
        self.last: Sample | None = None
        self.pruned: list[str] = []
        self.nvml: Nvml | None = None
        self.progress = ProgressTracker(
            self.run_dir / PROGRESS_FILE,
            self.run_dir / PROGRESS_LOG,
            self.spec.progress_window_s,
            self.spec.target_steps,
        )
        self.wakeups: str | None = None
        self._grid = time.monotonic()
        self._streak_trigger = "a sample on the interval"

    # The segment --------------------------------------------------------------------------------------------

    async def run(self) -> SegmentReport:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.policy.report_interval_s
        while True:
            with _locked(self.run_dir / "lock") as mine:
                if mine:
                    return await self._segment(deadline)
            # Another attempt still holds the lock (its worker lost contact but lives): wait, never start twice.
            self.heartbeat({"incarnation": self.inp.incarnation, "waiting_for_lock": True})
            await asyncio.sleep(0.5)

    async def _segment(self, deadline: float) -> SegmentReport:
        record, attached = await self._attach_or_launch()
        started_at = record.started_at if record else datetime.now(UTC)
        self.progress.restore()
        if record is None:
            return self._report(started_at, None, attached, death=self._death(None, started_at))
        reader = reader_for(self.policy, record.pid, self.cgroup)
        self._restore_curve()
        if self.nvml is None:
            self.nvml = Nvml()
        events = arm_events(self.policy, self.cgroup)
        self.wakeups = events.describe(self.policy.sample_interval_s)
        self._grid = time.monotonic()
        waker = Waker(events)
        try:
            if self.inp.stop_requested and record.is_alive():
                await self._graceful_stop(record, StopReason.REQUESTED)
            woken: list[str] = []
            while record.is_alive() and time.monotonic() < deadline:
                reason = self._sample(reader, woken)
                self._prune()
                self._beat(record)
                if reason is not None:
                    await self._graceful_stop(record, reason)
                    break
                # Below the threshold, the next sample confirms (or clears) it soon; else on the interval's grid.
                wait = self.policy.confirm_s if self.rule.consecutive > 0 else self._until_next_tick()
                woken = await waker.wait(min(wait, max(0.0, deadline - time.monotonic())))
        except asyncio.CancelledError:
            await self._on_cancel(record)
            raise
        finally:
            waker.close()
        if record.is_alive():
            return self._report(started_at, record, attached, death=None)
        return self._report(started_at, record, attached, death=self._death(record, started_at))

    async def _attach_or_launch(self) -> tuple[tp.TrainerRecord | None, bool]:
        tp.reap_keepers()
        intent = self.run_dir / tp.INTENT_FILE
        if intent.exists():
            # Launched before (by us or a predecessor): attach, or wait for the keeper's record.
            self.cgroup = TrainerCgroup.load(self.run_dir)
            record = await asyncio.to_thread(tp.wait_for_record, self.run_dir, LAUNCH_WAIT_S)
            return record, True
        validate_spec(self.spec)
        if self.policy.memory_limit_mib is not None:
            self.cgroup = TrainerCgroup.make(
                f"{self.spec.name}-{self.inp.incarnation}",
                self.policy.memory_limit_mib * MIB,
                self.cgroup_root,
            )
            self.cgroup.save(self.run_dir)
        self.preexisting = record_preexisting(
            self.spec.checkpoints, self.preexisting_file
        )  # before it writes
        self._write_oom_baseline()
        intent.write_text(datetime.now(UTC).isoformat())
        env = {
            **self.spec.env,
            "DAEDALUS_CHECKPOINT_DIR": str(self.spec.checkpoints.directory),
            "DAEDALUS_CHECKPOINT_EVERY": str(self.spec.checkpoints.every_steps),
            "DAEDALUS_PROGRESS_FILE": str(self.run_dir / PROGRESS_FILE),
        }
        if self.spec.target_steps is not None:
            env["DAEDALUS_TARGET_STEPS"] = str(self.spec.target_steps)
        if self.inp.resume_from:
            env["DAEDALUS_RESUME_FROM"] = self.inp.resume_from
        tp.launch(
            self.run_dir,
            self.spec.command,
            self.spec.cwd.expanduser(),
            env,
            self.policy.oom_score_adj,
            marker=f"{self.spec.name}#{self.inp.incarnation}",
            cgroup_procs=self.cgroup.procs if self.cgroup is not None else None,
        )
        record = await asyncio.to_thread(tp.wait_for_record, self.run_dir, LAUNCH_WAIT_S)
        log.info(
            "trainer started", run=self.spec.name, incarnation=self.inp.incarnation, pid=record and record.pid
        )
        return record, False

    def _write_oom_baseline(self) -> None:
        # The trainer's own cgroup, or else this process's (which the trainer inherits): its OOM counter is read
        # before the launch.
        own = self.cgroup.oom_file if self.cgroup is not None else None
        baseline = oom_counters(own or cgroup_oom_file(os.getpid()))
        (self.run_dir / OOM_BASELINE_FILE).write_text(json.dumps(dataclasses.asdict(baseline)))

    def _restore_curve(self) -> None:
        """Refill the stop rule from the curve on disk, so a re-attached watchdog keeps its window and count; the
        slope is fitted once at the end (a fit per restored bucket cost a segment ~1 s of CPU per 15 minutes)."""
        cutoff = time.time() - self.policy.slope_window_s
        # Room for the window's samples on the interval, and as many again woken or confirming in between.
        lines = 2 * self.policy.slope_window_s / self.policy.sample_interval_s + 64
        for sample in read_curve(self.run_dir / CURVE_FILE, tail_bytes=int(lines * CURVE_LINE_BYTES)):
            if sample.t >= cutoff:
                self.rule.observe(sample.t, sample.available, fit=False)
                self.last = sample
        if self.last is not None:
            self.rule.refit(self.last.t)
        # Heartbeat details of a retried attempt are newer than a curve line torn by a kill.
        consecutive = self.resume.get("consecutive")
        if isinstance(consecutive, int):
            self.rule.consecutive = max(self.rule.consecutive, consecutive)

    def _sample(self, reader: MemoryReader, woken: list[str] | None = None) -> StopReason | None:
        sample = Sample(
            t=time.time(),
            available=reader.available_bytes(),
            psi=read_psi_some_avg10(),
            gpu_used=self.nvml.used_bytes() if self.nvml else None,
            gpu_util=self.nvml.utilization_pct() if self.nvml else None,
        )
        append_sample(self.run_dir / CURVE_FILE, sample)
        self.last = sample
        self.samples += 1
        self.progress.read()
        before = self.rule.consecutive
        reason = self.rule.observe(sample.t, sample.available)
        if before == 0 and self.rule.consecutive > 0:
            self._streak_trigger = f"woken by {'; '.join(woken)}" if woken else "a sample on the interval"
        return reason

    def _until_next_tick(self) -> float:
        interval = self.policy.sample_interval_s
        # Tick on a fixed grid from the segment's start, so that sampling cost (and a sample a notification
        # woke in between) does not move the interval's ticks.
        return max(0.0, interval - ((time.monotonic() - self._grid) % interval))

    def _preexisting(self) -> frozenset[str]:
        if self.preexisting is None:  # an attached watchdog reads what the launching one recorded
            self.preexisting = record_preexisting(self.spec.checkpoints, self.preexisting_file)
        return self.preexisting

    def _prune(self) -> None:
        # Checkpoints the workflow still needs (an evaluation or a deployment decision waits on them) are spared.
        spare = self._preexisting() | {Path(path).name for path in self.inp.keep}
        self.pruned += [str(p) for p in prune_checkpoints(self.spec.checkpoints, spare)]

    def _beat(self, record: tp.TrainerRecord) -> None:
        self.heartbeat(
            {
                "incarnation": self.inp.incarnation,
                "pid": record.pid,
                "samples": self.samples,
                "consecutive": self.rule.consecutive,
                "available_bytes": self.last.available if self.last else None,
            }
        )

    # Stopping -----------------------------------------------------------------------------------------------

    async def _graceful_stop(self, record: tp.TrainerRecord, reason: StopReason) -> None:
        """Checkpoint signal -> grace -> SIGTERM to the group -> grace -> SIGKILL to the group."""
        stop_path = self.run_dir / STOP_FILE
        if not stop_path.exists():
            trigger = self._streak_trigger if reason is StopReason.THRESHOLD else reason.value
            tp.write_json_atomic(
                stop_path, {"reason": reason.value, "at": datetime.now(UTC).isoformat(), "trigger": trigger}
            )
        log.info("stopping trainer", run=self.spec.name, pid=record.pid, reason=reason.value)
        before = latest_checkpoint(self.spec.checkpoints)
        if tp.signal_pid(record, signal.Signals[self.policy.checkpoint_signal]):
            await self._wait(
                record,
                self.policy.checkpoint_grace_s,
                lambda: latest_checkpoint(self.spec.checkpoints) != before,
            )
        if tp.signal_group(record.pgid, signal.SIGTERM):
            stopping = tp.read_json(stop_path) or {}
            if "sigterm_at" not in stopping:  # when the grace ended: how long the checkpoint took shows here
                tp.write_json_atomic(stop_path, {**stopping, "sigterm_at": datetime.now(UTC).isoformat()})
            await self._wait(record, self.policy.term_grace_s, lambda: not record.group_alive())
        tp.signal_group(record.pgid, signal.SIGKILL)
        await self._wait(record, 5.0, lambda: (self.run_dir / tp.EXIT_FILE).exists())

    async def _wait(self, record: tp.TrainerRecord, timeout_s: float, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and record.is_alive() and not done():
            self.heartbeat({"incarnation": self.inp.incarnation, "stopping": True})
            await asyncio.sleep(STOP_POLL_S)

    async def _on_cancel(self, record: tp.TrainerRecord) -> None:
        """A cancel from the workflow stops the trainer (group and all); a worker going away leaves it running
        for the next worker to re-attach."""
        from temporalio import activity

        details = activity.cancellation_details() if activity.in_activity() else None
        if details is not None and not details.cancel_requested:
            return  # worker shutdown, pause, heartbeat timeout: the trainer keeps running for a re-attach
        await asyncio.shield(self._graceful_stop(record, StopReason.CANCELLED))

    # Deaths -------------------------------------------------------------------------------------------------

    def _death(self, record: tp.TrainerRecord | None, started_at: datetime) -> Death:
        """Classify the incarnation's end once; a retried call returns the same recorded death."""
        known = self.run_dir / DEATH_FILE
        if known.exists():
            return Death.model_validate_json(known.read_text())
        death = self._classify_death(record, started_at)
        tmp = known.with_suffix(".tmp")
        tmp.write_text(death.model_dump_json())
        os.replace(tmp, known)
        return death

    def _classify_death(self, record: tp.TrainerRecord | None, started_at: datetime) -> Death:
        if record is not None:
            # Whatever of the trainer's group survives its leader goes with it.
            tp.signal_group(record.pgid, signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while not (self.run_dir / tp.EXIT_FILE).exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        exit_record = tp.ExitRecord.load(self.run_dir)
        stop = tp.read_json(self.run_dir / STOP_FILE)
        stop_reason = StopReason(str(stop["reason"])) if stop else None
        stop_trigger = str(stop["trigger"]) if stop and stop.get("trigger") else None
        ended_at = exit_record.ended_at if exit_record else datetime.now(UTC)
        rc = exit_record.returncode if exit_record else None
        evidence, oom_kills = self._oom_evidence(record)
        cgroup = self.cgroup or TrainerCgroup.load(self.run_dir)
        peak = cgroup.peak_bytes() if cgroup is not None else None
        if cgroup is not None:
            cgroup.remove()  # its counters are read: nothing of the trainer is left in it
        cls, sig, summary = classify(rc, stop_reason, exit_record.error if exit_record else None, evidence)
        self._prune()  # the checkpoint written on our stop signal may push an older one out
        artifacts = self._keep_evidence()
        curve = list(read_curve(self.run_dir / CURVE_FILE))
        checkpoint = latest_checkpoint(self.spec.checkpoints)
        fit = self.rule.fit
        return Death(
            id=f"{self.spec.name}#{self.inp.incarnation}",
            incarnation=self.inp.incarnation,
            death_class=cls,
            exit_code=rc,
            signal=sig,
            stop_reason=stop_reason,
            started_at=started_at,
            ended_at=ended_at,
            lifetime_s=max(0.0, (ended_at - started_at).total_seconds()),
            summary=summary,
            last_checkpoint=str(checkpoint) if checkpoint else None,
            min_available_gib=min(s.available for s in curve) / GIB if curve else None,
            slope_gib_per_h=fit.gib_per_h if fit else None,
            oom_kills_during_run=oom_kills,
            oom_evidence=evidence,
            oom_score_adj=record.oom_score_adj if record else None,
            curve_path=artifacts[0],
            log_tail_path=artifacts[1],
            stop_trigger=stop_trigger,
            cgroup_peak_bytes=peak,
            progress=self.progress.read(),  # what it wrote last, after the last sample too
        )

    def _oom_evidence(self, record: tp.TrainerRecord | None) -> tuple[list[str], int | None]:
        """What the kernel says about OOM kills during the run, and the host-wide oom_kill delta."""
        try:
            raw = json.loads((self.run_dir / OOM_BASELINE_FILE).read_text())
        except (OSError, ValueError):
            raw = None
        if isinstance(raw, int):  # written by an earlier version: the host-wide count only
            raw = {"vmstat": raw}
        before = OomCounters(**raw) if isinstance(raw, dict) else OomCounters()
        cgroup_file = Path(before.cgroup_file) if before.cgroup_file else None
        return oom_evidence(before, oom_counters(cgroup_file), kernel_log_oom(record.pid) if record else None)

    def _keep_evidence(self) -> tuple[str | None, str | None]:
        """Copy the memory curve and the log's tail into the artifact store; history carries only the paths."""
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        curve_src = self.run_dir / CURVE_FILE
        curve_dst = self.artifact_dir / "memory-curve.csv"
        if curve_src.exists():
            tmp = curve_dst.with_suffix(".tmp")
            with tmp.open("w") as out:
                out.write("unix_time,available_bytes,psi_some_avg10,gpu_used_bytes,gpu_util_pct\n")
                out.write(curve_src.read_text())
            os.replace(tmp, curve_dst)
        tail_dst = self.artifact_dir / "log-tail.txt"
        tail = _tail(self.run_dir / tp.LOG_FILE, LOG_TAIL_BYTES)
        tmp = tail_dst.with_suffix(".tmp")
        tmp.write_text(tail)
        os.replace(tmp, tail_dst)
        return (str(curve_dst) if curve_dst.exists() else None, str(tail_dst))

    def _report(
        self, started_at: datetime, record: tp.TrainerRecord | None, attached: bool, death: Death | None
    ) -> SegmentReport:
        last = self.last
        checkpoint = latest_checkpoint(self.spec.checkpoints)
        fit = self.rule.fit
        return SegmentReport(
            incarnation=self.inp.incarnation,
            trainer_pid=record.pid if record else None,
            attached=attached,
            started_at=started_at,
            samples=self.samples,
            memory_now=MemoryReading(
                at=datetime.fromtimestamp(last.t, UTC),
                available_bytes=last.available,
                psi_some_avg10=last.psi,
                gpu_used_bytes=last.gpu_used,
                gpu_util_pct=last.gpu_util,
            )
            if last
            else None,
            slope_gib_per_h=fit.gib_per_h if fit else None,
            leak_flagged=self.rule.leak_flagged,
            last_checkpoint=str(checkpoint) if checkpoint else None,
            checkpoints_pruned=self.pruned,
            oom_score_adj=record.oom_score_adj if record else None,
            death=death,
            progress=self.progress.read(),
            checkpoints=[str(p) for p in complete_checkpoints(self.spec.checkpoints, self._preexisting())],
            wakeups=self.wakeups,
        )


def oom_evidence(
    before: OomCounters, after: OomCounters, kernel_log_line: str | None
) -> tuple[list[str], int | None]:
    """Evidence of a kernel OOM kill between two counter readings, and the host-wide oom_kill delta."""
    evidence: list[str] = []
    delta = None
    if before.vmstat is not None and after.vmstat is not None:
        delta = after.vmstat - before.vmstat
        if delta > 0:
            evidence.append(f"/proc/vmstat oom_kill +{delta} during the run (host-wide)")
    if before.cgroup is not None and after.cgroup is not None and after.cgroup > before.cgroup:
        evidence.append(
            f"{after.cgroup_file} oom_kill +{after.cgroup - before.cgroup} (the trainer's memory cgroup)"
        )
    if kernel_log_line:
        evidence.append(f"kernel log: {kernel_log_line}")
    return evidence, delta


def classify(
    returncode: int | None, stop: StopReason | None, error: str | None = None, oom: list[str] | None = None
) -> tuple[DeathClass, str | None, str]:
    """(class, signal name, one-line summary) of an exit status, given whether we had asked it to stop and
    what the kernel's OOM counters and log say: a SIGKILL is a kernel OOM only with that evidence."""
    sig: str | None = None
    if returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
    elif returncode in (137, 143):
        sig = "SIGKILL" if returncode == 137 else "SIGTERM"  # 128 + n, as a shell reports a killed child
    how = f"exit code {returncode}" if sig is None else f"killed by {sig}"
    if stop is not None:
        cls = (
            DeathClass.REQUESTED_STOP
            if stop in (StopReason.REQUESTED, StopReason.CANCELLED)
            else DeathClass.WATCHDOG_STOP
        )
        return cls, sig, f"our graceful stop ({stop.value}); {how}"
    if returncode is None:
        return DeathClass.LOST, None, "the trainer is gone and its exit status was not recorded"
    if error is not None:
        return DeathClass.CRASH, None, f"could not start: {error}"
    if sig == "SIGKILL":
        if oom:
            return DeathClass.KERNEL_OOM, sig, "SIGKILL by the kernel's OOM killer: " + "; ".join(oom)
        return (
            DeathClass.OUTSIDE_SIGKILL,
            sig,
            "killed by SIGKILL from outside (sender unknown): no OOM evidence (oom_kill counters unchanged, "
            "no kernel log record)",
        )
    if sig == "SIGTERM":
        return (
            DeathClass.OUTSIDE_SIGTERM,
            sig,
            "SIGTERM from someone else (earlyoom? systemd-oomd? a person?)",
        )
    if sig is not None:
        return DeathClass.OUTSIDE_SIGNAL, sig, f"{how}, not sent by us"
    if returncode == 0:
        return DeathClass.CLEAN_EXIT, None, "exited cleanly"
    return DeathClass.CRASH, None, f"crashed with {how}"


def _tail(path: Path, limit: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


async def supervise_segment(
    inp: SuperviseInput,
    *,
    state_root: Path,
    artifact_root: Path,
    heartbeat: Heartbeat,
    resume: dict[str, object] | None = None,
    cgroup_root: Path | None = None,
) -> SegmentReport:
    """Start or re-attach to incarnation `inp.incarnation` and watch it for one report interval. `cgroup_root`: a
    delegated cgroup v2 directory for a run's own memory cgroup (None: cgroup v1's memory controller)."""
    return await Supervisor(
        inp,
        state_root=state_root,
        artifact_root=artifact_root,
        heartbeat=heartbeat,
        resume=resume,
        cgroup_root=cgroup_root,
    ).run()
