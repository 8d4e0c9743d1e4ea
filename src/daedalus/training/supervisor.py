"""The training watchdog: start or re-attach to a trainer, sample memory, stop it gracefully, classify its death.

One call of `supervise_segment` watches one incarnation for up to `report_interval_s` and returns what it saw;
the workflow calls it again and again, so every call is also the re-attach path. Everything a later call needs
lives in the incarnation's state dir (training/incarnation.py): `trainer.json`/`exit.json` (the keeper,
training/trainer_keeper.py), `stop.json` (our stop), `curve.csv` (the samples, training/curve.py), `cgroup.json`
(the trainer's own memory cgroup, when the run has a memory limit), `progress.json` (what the trainer writes of
its steps) and `progress.csv` (the steps as the watchdog saw them change, training/progress.py).

Between samples the watchdog sleeps on the kernel's memory notifications (training/waker.py,
training/memory_events.py): a trainer that allocates gigabytes a second is sampled the moment its cgroup crosses
the threshold, not at the next tick. The stop rule is training/stop_rule.py, the death's class and evidence
training/deaths.py, the checkpoints training/checkpoints.py.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import structlog

from daedalus.errors import TrainingInputError
from daedalus.schemas.training import (
    GIB,
    Death,
    MemoryReading,
    SegmentReport,
    StopReason,
    SuperviseInput,
    TrainingRunSpec,
)
from daedalus.training import deaths
from daedalus.training import trainer_keeper as tp
from daedalus.training.checkpoints import (
    PREEXISTING_FILE,
    complete_checkpoints,
    latest_checkpoint,
    prune_checkpoints,
    record_preexisting,
)
from daedalus.training.curve import CURVE_FILE, CURVE_LINE_BYTES, Sample, append_sample, read_curve
from daedalus.training.incarnation import LOCK_FILE, STOP_FILE, artifact_dir_for, locked, run_dir_for
from daedalus.training.memory import MIB, MemoryReader, Nvml, TrainerCgroup, read_psi_some_avg10, reader_for
from daedalus.training.progress import PROGRESS_FILE, PROGRESS_LOG, ProgressTracker
from daedalus.training.stop_rule import StopRule
from daedalus.training.waker import Waker, arm_events

log = structlog.get_logger(__name__)

LAUNCH_WAIT_S = 15.0
STOP_POLL_S = 0.02
"""While stopping: how often the watchdog looks for the checkpoint it asked for (then SIGTERM at once)."""

Heartbeat = Callable[[dict[str, object]], None]


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
            with locked(self.run_dir / LOCK_FILE) as mine:
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
        deaths.write_oom_baseline(self.run_dir, self.cgroup.oom_file if self.cgroup is not None else None)
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
        return deaths.recorded(self.run_dir, lambda: self._classify_death(record, started_at))

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
        evidence, oom_kills = deaths.oom_evidence_since_launch(self.run_dir, record.pid if record else None)
        cgroup = self.cgroup or TrainerCgroup.load(self.run_dir)
        peak = cgroup.peak_bytes() if cgroup is not None else None
        if cgroup is not None:
            cgroup.remove()  # its counters are read: nothing of the trainer is left in it
        cls, sig, summary = deaths.classify(
            rc, stop_reason, exit_record.error if exit_record else None, evidence
        )
        self._prune()  # the checkpoint written on our stop signal may push an older one out
        artifacts = deaths.keep_evidence(self.run_dir, self.artifact_dir)
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
