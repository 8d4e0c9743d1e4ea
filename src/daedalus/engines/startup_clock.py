"""Engine start-ups timed apart from measuring: a gate's `timeout_s` covers its measuring, while its engines' starts
are bounded by their presets' `health_timeout_s` and, all together, by the gate's `startup_timeout_s`.

A vLLM start takes minutes on a real host (CUDA graph capture, a TP4 model's load), so an alternating A/B of 14
starts would spend most of a 600 s gate timeout starting servers and end INVALID. The measuring process
(`daedalus engine measure`, inside the gate's sandbox) therefore writes one line per event to the file its
worker names in `DAEDALUS_STARTUP_CLOCK`: `start <id> <monotonic s> <limit s>` as it launches a server, and
`ready <id> <monotonic s>` once that server is healthy or its start failed. The worker outside reads the file at
each heartbeat (`startup_seconds`) and moves the gate's deadline out by the wall time during which a start was in
progress. What the file says is the measured code's word, so it is bounded where it cannot lie: each start counts
for at most its own limit, starts that overlap count once (the wall time, not the sum), nothing before the step
began counts, and all of it together at most the gate's budget.

CLOCK_MONOTONIC is one clock for the whole machine (bubblewrap makes no time namespace), so the times written
inside the sandbox and read outside agree.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

STARTUP_CLOCK_ENV = "DAEDALUS_STARTUP_CLOCK"
"""The file a measuring process appends its start-up events to (set by the worker that runs the gate)."""
MAX_LINES = 10_000
"""More events than any gate's starts: a file past it is read no further (the rest is not credited)."""

_clock: Path | None = None


def configure(path: Path | None) -> None:
    """Where this process records its engine start-ups (its entry point reads DAEDALUS_STARTUP_CLOCK); None: nowhere."""
    global _clock
    _clock = path


def configured() -> Path | None:
    return _clock


@contextlib.contextmanager
def starting(name: str, limit_s: float) -> Iterator[None]:
    """Record a start of `name` that may take up to `limit_s`, from now until the block ends (healthy, or failed)."""
    path = _clock
    if path is None:
        yield
        return
    start_id = f"{name}-{uuid.uuid4().hex[:8]}"
    _append(path, f"start {start_id} {time.monotonic():.3f} {limit_s:.3f}")
    try:
        yield
    finally:
        _append(path, f"ready {start_id} {time.monotonic():.3f}")


def _append(path: Path, line: str) -> None:
    # One short write per line in append mode: two servers starting at once never interleave within a line.
    with path.open("a") as handle:
        handle.write(line + "\n")


@dataclass(frozen=True)
class Start:
    began: float
    limit_s: float
    ended: float | None


def read_starts(path: Path) -> list[Start]:
    """The starts a clock file records; malformed lines are skipped (they credit nothing)."""
    began: dict[str, tuple[float, float]] = {}
    ended: dict[str, float] = {}
    try:
        with path.open(errors="replace") as handle:
            for number, line in enumerate(handle):
                if number >= MAX_LINES:
                    break
                parts = line.split()
                try:
                    if len(parts) == 4 and parts[0] == "start":
                        began.setdefault(parts[1], (float(parts[2]), max(0.0, float(parts[3]))))
                    elif len(parts) == 3 and parts[0] == "ready":
                        ended.setdefault(parts[1], float(parts[2]))
                except ValueError:
                    continue
    except OSError:
        return []
    return [Start(at, limit, ended.get(start_id)) for start_id, (at, limit) in began.items()]


def startup_seconds(path: Path, *, since: float, now: float, budget_s: float) -> float:
    """Wall seconds in [since, now] during which an engine start was in progress, each start counted up to its
    own limit, at most `budget_s` in all."""
    intervals = []
    for start in read_starts(path):
        low = max(start.began, since)
        high = min(start.ended if start.ended is not None else now, start.began + start.limit_s, now)
        if high > low:
            intervals.append((low, high))
    covered = 0.0
    reach = since
    for low, high in sorted(intervals):
        low = max(low, reach)
        if high > low:
            covered += high - low
            reach = high
    return min(covered, budget_s)
