"""Where an incarnation lives on the host: its state dir (the keeper's records, our stop, the curve, the
progress, the lock that keeps two watchdogs off one trainer) and its artifact dir (the evidence of its death).

Both are per start of the run name (`filing`), so a run started again never attaches to an earlier one's state.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from daedalus.schemas.training import TrainingRunSpec

STOP_FILE = "stop.json"
"""Our stop, written before the first signal, so a restarted watchdog still knows a death was ours."""
DEATH_FILE = "death.json"
OOM_BASELINE_FILE = "oom_kills.start"
LOCK_FILE = "lock"


def run_dir_for(state_root: Path, spec: TrainingRunSpec, incarnation: int, filing: str = "") -> Path:
    """Per start of the run name (`filing`), so a run started again never attaches to an earlier one's state."""
    return state_root / spec.name / filing / f"incarnation-{incarnation:04d}"


def artifact_dir_for(artifact_root: Path, spec: TrainingRunSpec, incarnation: int, filing: str = "") -> Path:
    return artifact_root / "training" / spec.name / filing / f"incarnation-{incarnation:04d}"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[bool]:
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
