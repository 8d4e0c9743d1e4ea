"""A run's checkpoints on disk: which are complete, which were there before the run, and pruning the old ones.

A checkpoint is a directory in `CheckpointPolicy.directory` holding the policy's marker file (written last, so
its mtime orders them). What the directory held when the run first started is recorded once
(`checkpoints-before.json`) and never counted or pruned as the run's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from daedalus.schemas.training import CheckpointPolicy

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
