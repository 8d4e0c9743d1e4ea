"""Checkpoint pruning deletes only checkpoints the run itself wrote: on real directories."""

from __future__ import annotations

import os
import time
from pathlib import Path

from daedalus.schemas.training import CheckpointPolicy
from daedalus.training.checkpoints import complete_checkpoints, prune_checkpoints, record_preexisting


def checkpoint(directory: Path, name: str, marker: str = "COMPLETE") -> Path:
    path = directory / name
    path.mkdir(parents=True)
    (path / "weights.bin").write_text(name)
    (path / marker).write_text("")
    time.sleep(0.01)  # markers' mtimes order the checkpoints
    return path


def test_what_was_there_before_the_run_is_never_pruned(tmp_path: Path) -> None:
    """Someone's directory as the checkpoint directory: its own subdirectories, markers and all, survive."""
    directory = tmp_path / "carol"
    theirs = [checkpoint(directory, f"theirs-{i}") for i in range(3)]
    policy = CheckpointPolicy(directory=directory, keep=1)
    spare = record_preexisting(policy, tmp_path / "before.json")
    assert record_preexisting(policy, tmp_path / "before.json") == spare, "recorded once, at the run's start"
    ours = [checkpoint(directory, f"step-{i}") for i in range(3)]
    removed = prune_checkpoints(policy, spare)
    assert sorted(removed) == ours[:2]
    assert all(path.is_dir() for path in theirs) and ours[2].is_dir()


def test_a_marker_must_be_a_real_file_of_the_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    real = checkpoint(directory, "step-1")
    linked = directory / "step-2"
    linked.mkdir()
    os.symlink(real / "COMPLETE", linked / "COMPLETE")
    as_dir = directory / "step-3"
    (as_dir / "COMPLETE").mkdir(parents=True)
    os.symlink(real, directory / "step-4")
    assert complete_checkpoints(CheckpointPolicy(directory=directory)) == [real]
