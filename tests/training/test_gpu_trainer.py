"""The PyTorch trainer, on the CPU: loss falls, checkpoints are complete, the checkpoint signal and resume work,
and the leak is real resident host memory. torch is no dependency of Daedalus: these tests need the `gpu` extra."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("torch")

SMALL = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "4", "--vocab", "32",
         "--log-every", "5"]  # fmt: skip


def trainer(*args: str, env: dict[str, str] | None = None) -> list[str]:
    return [sys.executable, "-m", "daedalus.training.gpu_trainer", *SMALL, *args]


def test_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first = subprocess.run(trainer("--steps", "20", "--every", "10", "--checkpoint-dir", str(ckpt)),
                           capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    losses = [float(line.split()[3]) for line in first.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 4 and losses[-1] < losses[0]  # it learns the recurrence
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-0000010", "ckpt-0000020"]
    for path in ckpt.iterdir():
        assert {p.name for p in path.iterdir()} == {"model.pt", "state.json", "COMPLETE"}
    env = {**os.environ, "DAEDALUS_RESUME_FROM": str(ckpt / "ckpt-0000020")}
    second = subprocess.run(trainer("--steps", "25", "--every", "5", "--checkpoint-dir", str(ckpt)), env=env,
                            capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    assert "start step=20" in second.stdout and "finished at step 25" in second.stdout
    assert json.loads((ckpt / "ckpt-0000025" / "state.json").read_text())["step"] == 25


def test_checkpoint_signal_and_host_memory_leak(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(trainer("--every", "100000", "--checkpoint-dir", str(ckpt), "--leak-mib-per-step", "8",
                                    "--min-step-s", "0.02"), stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "trainer pid=" in first
        while "step 5 " not in proc.stdout.readline():
            pass
        rss_early = psutil.Process(proc.pid).memory_info().rss
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while not any((p / "COMPLETE").exists() for p in ckpt.glob("ckpt-*")):
            assert time.monotonic() < deadline, "no checkpoint after the checkpoint signal"
            time.sleep(0.05)
        while "step 30 " not in proc.stdout.readline():
            pass
        grown = psutil.Process(proc.pid).memory_info().rss - rss_early
        assert grown > 100 * 1024 * 1024  # 25 steps x 8 MiB, resident
    finally:
        proc.kill()
        proc.wait()
