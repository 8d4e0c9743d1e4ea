"""The watchdog's CPU cost at 1 Hz and 10 Hz, and its reaction from threshold crossing to SIGTERM.

Usage: .venv/bin/python bench/watchdog.py [--cpu-seconds 30] [--runs 20]
Writes bench/results/watchdog.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from daedalus.engines.watchdog import CURVE_FILE, STOP_FILE, read_curve, run_dir_for, supervise_segment
from daedalus.schemas.training import (
    CheckpointPolicy,
    MemorySource,
    SuperviseInput,
    TrainingRunSpec,
    WatchdogPolicy,
)

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "tests" / "fixtures" / "trainer.py"
RESULTS = ROOT / "bench" / "results" / "watchdog.json"


def spec_for(tmp: Path, name: str, policy: WatchdogPolicy, *args: str) -> TrainingRunSpec:
    return TrainingRunSpec(
        name=name,
        host="bench",
        command=[sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp / name / "ckpt"), *args],
        cwd=tmp,
        checkpoints=CheckpointPolicy(directory=tmp / name / "ckpt", every_steps=50, keep=2),
        watchdog=policy,
        state_dir=tmp / "state",
        artifact_dir=tmp / "artifacts",
    )


async def segment(spec: TrainingRunSpec, stop: bool = False) -> None:
    await supervise_segment(
        SuperviseInput(spec=spec, incarnation=1, stop_requested=stop),
        state_root=spec.state_dir or Path(),
        artifact_root=spec.artifact_dir or Path(),
        heartbeat=lambda _: None,
    )


async def cpu_cost(tmp: Path, hz: float, seconds: float) -> float:
    """% of one core this process spends watching a flat trainer on host MemAvailable (the production reading)."""
    policy = WatchdogPolicy(sample_interval_s=1 / hz, min_available_gib=0.5, report_interval_s=seconds)
    spec = spec_for(tmp, f"cpu-{hz:g}hz", policy, "--step-s", "0.5")
    # The first segment launches the trainer; measure a pure watching segment after it.
    await segment(spec.model_copy(update={"watchdog": policy.model_copy(update={"report_interval_s": 1.0})}))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    await segment(spec)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await segment(spec, stop=True)
    return 100.0 * cpu / wall


async def reaction(tmp: Path, index: int) -> tuple[int, float]:
    """(samples from the first below-threshold sample to the stop, inclusive; milliseconds to SIGTERM)."""
    policy = WatchdogPolicy(
        memory_source=MemorySource.PROCESS_TREE,
        budget_mib=400,
        min_available_gib=250 / 1024,
        sample_interval_s=0.1,
        consecutive_samples=2,
        slope_window_s=30,
        min_fit_span_s=2,
        checkpoint_grace_s=0,  # SIGTERM right after the checkpoint signal: measures the decision itself
        term_grace_s=2,
        report_interval_s=60,
    )
    spec = spec_for(tmp, f"react-{index}", policy, "--mib-per-step", "6", "--step-s", "0.05")
    await segment(spec)
    run_dir = run_dir_for(tmp / "state", spec, 1)
    stop = json.loads((run_dir / STOP_FILE).read_text())
    stopped_at = datetime.fromisoformat(stop["at"]).timestamp()
    samples = [s for s in read_curve(run_dir / CURVE_FILE) if s.t <= stopped_at]
    below = [s for s in samples if s.available < policy.threshold_bytes]
    first = below[0]
    count = sum(1 for s in samples if s.t >= first.t)
    return count, (stopped_at - first.t) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        cpu_1 = await cpu_cost(tmp, 1.0, args.cpu_seconds)
        cpu_10 = await cpu_cost(tmp, 10.0, args.cpu_seconds / 2)
        reactions = [await reaction(tmp, i) for i in range(args.runs)]
    samples = [r[0] for r in reactions]
    millis = [r[1] for r in reactions]
    result = {
        "cpu_pct_1hz": round(cpu_1, 3),
        "cpu_pct_10hz": round(cpu_10, 3),
        "reaction_samples_max": max(samples),
        "reaction_samples_median": statistics.median(samples),
        "reaction_ms_median": round(statistics.median(millis), 1),
        "reaction_ms_max": round(max(millis), 1),
        "runs": args.runs,
        "consecutive_samples": 2,
        "cpu_seconds": args.cpu_seconds,
    }
    table = Table(title="training watchdog")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("goal")
    table.add_row("CPU at 1 Hz (% of one core)", f"{cpu_1:.3f}", "< 1")
    table.add_row("CPU at 10 Hz (% of one core)", f"{cpu_10:.3f}", "")
    table.add_row(f"reaction, samples (max of {args.runs})", str(max(samples)), "<= 2")
    table.add_row("reaction, samples (median)", f"{statistics.median(samples):g}", "")
    table.add_row(
        "crossing -> SIGTERM, ms (median / max)",
        f"{result['reaction_ms_median']} / {result['reaction_ms_max']}",
        "",
    )
    Console().print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
