"""The trainer's progress: the steps (and tokens) it writes, their throughput over a window and the ETA."""

from __future__ import annotations

import contextlib
import json
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from daedalus.schemas.training import ProgressReading

PROGRESS_FILE = "progress.json"
PROGRESS_LOG = "progress.csv"


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
