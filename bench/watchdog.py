"""The training watchdog: its CPU, and a fast memory spike stopped gracefully before the kernel's OOM killer acts.

Usage: .venv/bin/python bench/watchdog.py [--runs 5] [--cpu-seconds 30] [--cpu-rounds 3] [--rate 2] [--limit-mib 3072]
Writes bench/results/watchdog.json (bench/record.py: the commit, the machine, its load before and during).

1. CPU, steady: % of one core this process (the watchdog and nothing else) uses watching a flat trainer for
   --cpu-seconds, `time.process_time()` over wall time, --cpu-rounds times per mode: kernel notifications and a
   sample a second (the trainer in its own memory cgroup); polling at 20 Hz instead; host MemAvailable at 1 Hz
   with PSI (the default policy). The leak fit runs as in a run past its 15-minute window (the curve file is
   given that much flat history first).
2. The spike: the tests' trainer idles 2 s, then maps --rate GiB a second (MAP_POPULATE: resident at once; as
   fast as this machine faults pages in, if that is slower) in its own memory cgroup of --limit-mib, until the
   watchdog stops it or the cgroup's OOM killer kills it. The threshold is 1 GiB below the limit, 2 samples.
   Modes, interleaved, --runs each: notifications + a sample a second (the confirming sample 50 ms after the
   first below); polling at 1 Hz with the 2 samples 1 s apart (the rule before notifications); polling at 20 Hz.
   Per run: how it ended (our graceful stop, or the kernel's OOM kill by the trainer cgroup's own oom_kill
   counter), whether the checkpoint asked for was complete, the times from the spike's start (the trainer's
   clock, in its log) to the first sample below the threshold, our stop decision (stop.json), the checkpoint's
   COMPLETE and the trainer's exit (the keeper's exit.json); the cgroup's peak; the rate reached (the trainer's
   count when asked to checkpoint, else the peak over the time to the kill); what woke the watchdog; its CPU
   over the run (launch and death classification included). /proc/vmstat's host-wide oom_kill delta is recorded
   too: on a shared machine it counts other people's processes as well.

The spike never leaves its cgroup: the rest of the machine does not feel it.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from daedalus.errors import TrainingInputError
from daedalus.schemas.training import (
    GIB,
    CheckpointPolicy,
    DeathClass,
    MemorySource,
    SegmentReport,
    SuperviseInput,
    TrainingRunSpec,
    WatchdogPolicy,
)
from daedalus.training import trainer_keeper as tp
from daedalus.training.curve import CURVE_FILE, read_curve
from daedalus.training.incarnation import STOP_FILE, run_dir_for
from daedalus.training.memory import TrainerCgroup, read_counter_file
from daedalus.training.supervisor import supervise_segment
from record import Recording  # bench/record.py: this script's directory is first on sys.path

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "tests" / "fixtures" / "trainer.py"
RESULTS = ROOT / "bench" / "results" / "watchdog.json"
MODES: dict[str, tuple[bool, float, float | None]] = {
    # (kernel notifications, sample interval, the confirming sample's delay: None = the interval)
    "notifications + 1 Hz": (True, 1.0, 0.05),
    "polling 1 Hz (2 samples 1 s apart)": (False, 1.0, None),
    "polling 20 Hz": (False, 0.05, 0.05),
}
HEADROOM_GIB = 1.0


def spec_for(tmp: Path, name: str, policy: WatchdogPolicy, *args: str) -> TrainingRunSpec:
    return TrainingRunSpec(
        name=name,
        host="bench",
        command=[sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp / name / "ckpt"), *args],
        cwd=tmp,
        checkpoints=CheckpointPolicy(directory=tmp / name / "ckpt", every_steps=100_000, keep=2),
        watchdog=policy,
        state_dir=tmp / "state",
        artifact_dir=tmp / "artifacts",
    )


async def segment(spec: TrainingRunSpec, stop: bool = False) -> SegmentReport:
    return await supervise_segment(
        SuperviseInput(spec=spec, incarnation=1, stop_requested=stop),
        state_root=spec.state_dir or Path(),
        artifact_root=spec.artifact_dir or Path(),
        heartbeat=lambda _: None,
    )


def cgroup_policy(
    limit_mib: int, events: bool, interval_s: float, report_s: float, confirm_s: float | None = 0.05
) -> WatchdogPolicy:
    """The defaults (the seed's guard rails: a leak fit over 15 minutes), but the trainer's own cgroup."""
    return WatchdogPolicy(
        memory_source=MemorySource.CGROUP,
        memory_limit_mib=limit_mib,
        min_available_gib=HEADROOM_GIB,
        memory_events=events,
        sample_interval_s=interval_s,
        consecutive_samples=2,
        confirm_interval_s=confirm_s,
        checkpoint_grace_s=10,
        term_grace_s=5,
        report_interval_s=report_s,
    )


async def steady_cpu(
    tmp: Path, name: str, policy: WatchdogPolicy, seconds: float
) -> tuple[float, str | None]:
    """% of one core over a watching segment of a flat trainer. The segment that launches the trainer is not
    counted; before the measured one, the curve file is given a flat history as long as the leak fit's window,
    so the watchdog refits its slope as it does once a run is that old (every window/180 s, at least every 1 s)."""
    spec = spec_for(tmp, name, policy, "--step-s", "0.5")
    await segment(spec.changed(watchdog=policy.changed(report_interval_s=1.0)))
    curve = run_dir_for(tmp / "state", spec, 1) / CURVE_FILE
    now, interval = time.time(), policy.sample_interval_s
    points = int(policy.slope_window_s / interval)
    flat = int(2 * GIB) if policy.memory_source is MemorySource.CGROUP else int(10 * GIB)
    curve.write_text("".join(f"{now - (points - i) * interval:.3f},{flat},,,\n" for i in range(points)))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    report = await segment(spec)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await segment(spec, stop=True)
    return 100.0 * cpu / wall, report.wakeups


def _unix(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


async def spike(tmp: Path, name: str, policy: WatchdogPolicy, rate: float) -> dict[str, Any]:
    limit_mib = policy.memory_limit_mib or 0
    spec = spec_for(tmp, name, policy, "--step-s", "0.1", "--spike-gib-per-s", f"{rate:g}", "--spike-after-s", "2",
                    "--max-mib", str(limit_mib + 1024))  # fmt: skip
    vmstat_before = read_counter_file(Path("/proc/vmstat"))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    report = await segment(spec)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    vmstat_after = read_counter_file(Path("/proc/vmstat"))
    death = report.death
    assert death is not None, f"{name}: the trainer outlived its segment"
    run_dir = run_dir_for(tmp / "state", spec, 1)
    log = (run_dir / tp.LOG_FILE).read_text()
    started = float(re.findall(r"spike start at=([0-9.]+)", log)[0])
    reached = re.findall(r"spike rate=([0-9.]+)", log)
    threshold = policy.threshold_bytes
    crossing = next((s.t for s in read_curve(run_dir / CURVE_FILE) if s.available < threshold), None)
    stop = tp.read_json(run_dir / STOP_FILE)
    exit_record = tp.ExitRecord.load(run_dir)
    checkpoint = Path(death.last_checkpoint) if death.last_checkpoint else None
    complete = checkpoint is not None and (checkpoint / "COMPLETE").is_file() and "requested=True" in log
    cgroup_kills = sum(
        int(m)
        for line in death.oom_evidence
        if "trainer's memory cgroup" in line
        for m in re.findall(r"\+(\d+)", line)
    )

    def ms(at: float | None) -> float | None:
        return round((at - started) * 1000, 1) if at is not None else None

    return {
        "ended": "graceful stop"
        if death.death_class is DeathClass.WATCHDOG_STOP
        else death.death_class.value,
        "checkpoint_complete": bool(complete and death.death_class is DeathClass.WATCHDOG_STOP),
        "oom_kills_in_trainer_cgroup": cgroup_kills,
        "oom_kills_host_wide_delta": (vmstat_after or 0) - (vmstat_before or 0),
        "ms_to_first_sample_below": ms(crossing),
        "ms_to_stop_decision": ms(_unix(str(stop["at"]))) if stop else None,
        "ms_to_checkpoint_complete": ms((checkpoint / "COMPLETE").stat().st_mtime)
        if complete and checkpoint
        else None,
        "ms_to_sigterm": ms(_unix(str(stop["sigterm_at"]))) if stop and stop.get("sigterm_at") else None,
        "ms_to_trainer_exit": ms(exit_record.ended_at.timestamp()) if exit_record else None,
        "peak_gib": round((death.cgroup_peak_bytes or 0) / GIB, 3),
        "limit_gib": round(limit_mib / 1024, 3),
        # The trainer's own count when the checkpoint was asked for; else (killed) the peak over the time to the kill.
        "rate_reached_gib_per_s": float(reached[0])
        if reached
        else (
            round((death.cgroup_peak_bytes or 0) / GIB / (exit_record.ended_at.timestamp() - started), 3)
            if exit_record and exit_record.ended_at.timestamp() > started
            else None
        ),
        "woken_by": death.stop_trigger,
        "watchdog_cpu_pct": round(100.0 * cpu / wall, 3),
        "wakeups": report.wakeups,
    }


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 1) if present else None


def _max(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(max(present), 1) if present else None


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5, help="spike runs per mode")
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    parser.add_argument("--cpu-rounds", type=int, default=3, help="steady CPU measurements per mode")
    parser.add_argument("--rate", type=float, default=2.0, help="the spike, GiB/s")
    parser.add_argument("--limit-mib", type=int, default=3072, help="the trainer cgroup's memory limit")
    args = parser.parse_args()
    try:
        TrainerCgroup.make("bench-probe", 64 * 1024 * 1024).remove()
    except TrainingInputError as error:
        sys.exit(f"bench/watchdog.py runs the spike in a memory cgroup of its own: {error}")
    recording = Recording.start()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        steady = {
            "notifications + 1 Hz (cgroup)": cgroup_policy(args.limit_mib, True, 1.0, args.cpu_seconds),
            "polling 20 Hz (cgroup)": cgroup_policy(args.limit_mib, False, 0.05, args.cpu_seconds),
            "host MemAvailable 1 Hz + PSI (the default policy)": WatchdogPolicy(
                min_available_gib=0.5, report_interval_s=args.cpu_seconds
            ),
        }
        measured: dict[str, list[float]] = {label: [] for label in steady}
        wakeups: dict[str, str | None] = {}
        for round_index in range(
            args.cpu_rounds
        ):  # modes interleaved: the machine's load falls on each alike
            for index, (label, policy) in enumerate(steady.items()):
                pct, wakeups[label] = await steady_cpu(
                    tmp, f"cpu-{index}-{round_index}", policy, args.cpu_seconds
                )
                measured[label].append(round(pct, 3))
        cpu = {
            label: {
                "cpu_pct_of_one_core": values,
                "median": round(statistics.median(values), 3),
                "max": max(values),
                "wakeups": wakeups[label],
            }
            for label, values in measured.items()
        }
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in MODES}
        for round_index in range(args.runs):  # modes interleaved, so the machine's load falls on each alike
            for mode_index, (label, (events, interval, confirm)) in enumerate(MODES.items()):
                policy = cgroup_policy(args.limit_mib, events, interval, 60.0, confirm)
                runs[label].append(await spike(tmp, f"spike-{mode_index}-{round_index}", policy, args.rate))
        summary = {}
        for label, results in runs.items():
            summary[label] = {
                "runs": len(results),
                "graceful_stops": sum(r["ended"] == "graceful stop" for r in results),
                "checkpoints_complete": sum(r["checkpoint_complete"] for r in results),
                "runs_oom_killed_in_trainer_cgroup": sum(
                    r["oom_kills_in_trainer_cgroup"] > 0 for r in results
                ),
                "ms_to_first_sample_below_median": _median([r["ms_to_first_sample_below"] for r in results]),
                "ms_to_stop_decision_median_max": [
                    _median([r["ms_to_stop_decision"] for r in results]),
                    _max([r["ms_to_stop_decision"] for r in results]),
                ],
                "ms_to_sigterm_median_max": [
                    _median([r["ms_to_sigterm"] for r in results]),
                    _max([r["ms_to_sigterm"] for r in results]),
                ],
                "ms_to_trainer_exit_median_max": [
                    _median([r["ms_to_trainer_exit"] for r in results]),
                    _max([r["ms_to_trainer_exit"] for r in results]),
                ],
                "peak_gib_max": _max([r["peak_gib"] for r in results]),
                "rate_reached_gib_per_s_median": _median([r["rate_reached_gib_per_s"] for r in results]),
                "watchdog_cpu_pct_median": _median([r["watchdog_cpu_pct"] for r in results]),
            }
        figures = {
            "spike_rate_asked_gib_per_s": args.rate,
            "trainer_cgroup_limit_mib": args.limit_mib,
            "threshold_gib_below_limit": HEADROOM_GIB,
            "steady_cpu": cpu,
            "spike_summary": summary,
            "spike_runs": runs,
        }
        recording.write(figures, RESULTS)
    console = Console()
    table = Table(
        title=f"watchdog CPU on a flat trainer, % of one core ({args.cpu_rounds} x {args.cpu_seconds:g} s)"
    )
    table.add_column("mode")
    table.add_column("median", justify="right")
    table.add_column("max", justify="right")
    table.add_column("woken by")
    for label, row in cpu.items():
        table.add_row(label, f"{row['median']:.3f}", f"{row['max']:.3f}", str(row["wakeups"])[:90])
    console.print(table)
    spike_table = Table(
        title=f"a {args.rate:g} GiB/s spike into a {args.limit_mib} MiB cgroup, threshold 1 GiB below"
    )
    for column in ("mode", "graceful stops", "checkpoint complete", "OOM-killed", "start→stop decision ms (median/max)",
                   "start→SIGTERM ms (median/max)", "start→exit ms (median/max)", "peak GiB (max)", "rate reached GiB/s", "watchdog CPU %"):  # fmt: skip
        spike_table.add_column(column)
    for label, row in summary.items():
        n = row["runs"]
        spike_table.add_row(
            label,
            f"{row['graceful_stops']}/{n}",
            f"{row['checkpoints_complete']}/{n}",
            f"{row['runs_oom_killed_in_trainer_cgroup']}/{n}",
            "{} / {}".format(*row["ms_to_stop_decision_median_max"]),
            "{} / {}".format(*row["ms_to_sigterm_median_max"]),
            "{} / {}".format(*row["ms_to_trainer_exit_median_max"]),
            str(row["peak_gib_max"]),
            str(row["rate_reached_gib_per_s_median"]),
            str(row["watchdog_cpu_pct_median"]),
        )
    console.print(spike_table)


if __name__ == "__main__":
    asyncio.run(main())
