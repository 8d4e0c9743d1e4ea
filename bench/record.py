"""What every benchmark writes beside its table: its figures, with the commit, the machine, its load and the command.

A figure means little without the conditions it was measured under: on a shared 2-core machine the same code
gives different absolute times from one hour to the next. So each result file says which commit ran (and whether
its tree was clean), on how many cores of what, how loaded the machine was before the run and while it ran
(other processes' CPU, read by psutil each second), and the exact command, so it can be run again.

    recording = Recording.start()        # first thing: the load before the run, then a sampler while it runs
    ...measure...
    recording.write(figures, RESULTS / "sandbox.json")

writes the figures with a `run` entry beside them: commit, machine, load before and during, command, duration.
The runs the README quotes are copied to `bench/reference/`, and the README's tables are made from those files
(bench/figures.py).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
REFERENCE = ROOT / "bench" / "reference"
SAMPLE_S = 1.0


def commit() -> dict[str, Any]:
    """The commit the benchmark ran at, and whether the working tree differed from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "sha": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": model or platform.processor(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


def load_now() -> dict[str, float]:
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1m": one, "loadavg_5m": five, "loadavg_15m": fifteen}


class _LoadSampler(threading.Thread):
    """The machine's CPU use each second while the benchmark runs, in cores, with this process tree's share."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="bench-load")
        self.stop = threading.Event()
        self.total: list[float] = []
        self.ours: list[float] = []

    def _ours(self) -> float:
        me = psutil.Process()
        seconds = 0.0
        for process in [me, *me.children(recursive=True)]:
            try:
                times = process.cpu_times()
                seconds += times.user + times.system
            except psutil.Error:
                continue
        return seconds

    def run(self) -> None:
        psutil.cpu_percent()
        before, at = self._ours(), time.monotonic()
        while not self.stop.wait(SAMPLE_S):
            cores = psutil.cpu_percent() / 100 * (os.cpu_count() or 1)
            now, when = self._ours(), time.monotonic()
            self.total.append(cores)
            self.ours.append(max(0.0, (now - before) / (when - at)))
            before, at = now, when

    def summary(self) -> dict[str, float | int]:
        if not self.total:
            return {"samples": 0}
        others = [max(0.0, t - o) for t, o in zip(self.total, self.ours, strict=True)]
        return {
            "samples": len(self.total),
            "busy_cores_mean": round(sum(self.total) / len(self.total), 3),
            "busy_cores_max": round(max(self.total), 3),
            "other_processes_cores_mean": round(sum(others) / len(others), 3),
            "other_processes_cores_max": round(max(others), 3),
        }


class Recording:
    """One benchmark run: its conditions are taken when it starts, and `write` stores them with its figures."""

    def __init__(self) -> None:
        self.started_at = datetime.now(UTC)
        self.started = time.monotonic()
        self.before = load_now()
        self.sampler = _LoadSampler()

    @classmethod
    def start(cls) -> Recording:
        recording = cls()
        recording.sampler.start()
        return recording

    def conditions(self) -> dict[str, Any]:
        self.sampler.stop.set()
        self.sampler.join(timeout=2 * SAMPLE_S)
        return {
            "command": " ".join(shlex.quote(arg) for arg in ["python", *sys.argv]),
            "commit": commit(),
            "machine": machine(),
            "load": {"before": self.before, "during": self.sampler.summary()},
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "seconds": round(time.monotonic() - self.started, 1),
        }

    def write(self, figures: dict[str, Any], path: Path) -> Path:
        """`figures` with the run's conditions under `run`, as JSON at `path`."""
        if "run" in figures:
            raise ValueError("a benchmark's figures may not use the key `run`: it holds the run's conditions")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**figures, "run": self.conditions()}, indent=2, default=str) + "\n")
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        return path
