"""What the bubblewrap sandbox costs a tool call: `run_shell("true")` and `read_file` through the Toolbox (bwrap
start, the command, the sweep of /proc for the step's token) against the same command as a bare host subprocess.

Interleaved rounds on one linked worktree; medians and p90 in milliseconds. On a shared machine the absolute
times move with the load: read the ratio of the two, measured side by side.

Run: .venv/bin/python bench/sandbox.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import make_engine_repo  # noqa: E402

from daedalus.agents import worktree as wt  # noqa: E402
from daedalus.agents.settings import DEFAULT_DENY  # noqa: E402
from daedalus.agents.tools import Toolbox  # noqa: E402
from record import Recording  # noqa: E402


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


async def measure(rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        repo = make_engine_repo(tmp / "engine")
        worktree = tmp / "wt"
        wt.prepare_worktree(repo=repo, base_commit="main", worktree=worktree, branch="daedalus/b1/attempt-1")
        box = Toolbox(worktree, deny=DEFAULT_DENY)
        samples: dict[str, list[float]] = {"host sh -c true": [], "run_shell true": [], "read_file": []}
        for _ in range(rounds):
            t = time.perf_counter()
            proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", "true", cwd=worktree)
            await proc.wait()
            samples["host sh -c true"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await box.call("run_shell", {"command": "true"})
            samples["run_shell true"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await box.call("read_file", {"path": "speed.txt"})
            samples["read_file"].append(time.perf_counter() - t)
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=repo, check=False)
        return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    recording = Recording.start()
    samples = asyncio.run(measure(args.rounds))
    base = statistics.median(samples["host sh -c true"])
    table = Table(title=f"sandbox cost per tool call ({args.rounds} interleaved rounds)")
    for column in ("call", "median ms", "p90 ms", "median / host"):
        table.add_column(column)
    results = {}
    for name, values in samples.items():
        median = statistics.median(values)
        results[name] = {"median_ms": median * 1e3, "p90_ms": p90(values) * 1e3, "ratio": median / base}
        table.add_row(name, f"{median * 1e3:.1f}", f"{p90(values) * 1e3:.1f}", f"{median / base:.1f}x")
    Console().print(table)
    recording.write({"rounds": args.rounds, "results": results}, ROOT / "bench" / "results" / "sandbox.json")


if __name__ == "__main__":
    main()
