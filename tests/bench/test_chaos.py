"""The chaos bench, small (bench/chaos.py): tickets of every design, a training run and API decisions while
host and control workers are SIGKILLed and Temporal is SIGKILLed and restarted. Nothing may be lost: every
ticket closes as its inputs imply, every trail is whole, every answer is applied exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEED = 512797
"""A fixed fault schedule, so a failure here reruns exactly (`bench/chaos.py --seed N` explores new ones)."""
BENCH_LIMIT_S = 540


@pytest.mark.timeout(BENCH_LIMIT_S + 60)
def test_a_few_faults_lose_nothing(tmp_path: Path) -> None:
    seed = SEED
    out = tmp_path / "chaos.json"
    command = [sys.executable, str(ROOT / "bench" / "chaos.py"), "--out", str(out), "--no-llama"]
    command += ["--seed", str(seed)]
    command += ["--tickets", "6", "--faults", "5", "--window-s", "20", "--settle-timeout-s", "150"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=BENCH_LIMIT_S, check=False)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    result = json.loads(out.read_text())
    report = f"seed {seed}: " + json.dumps(result["problems"], indent=1)
    assert result["faults"] == 5
    assert result["tickets"] == 8  # one umbrella with two children among the six
    assert result["tickets_closed"] == result["tickets"], report
    assert result["wrong_outcomes"] == 0, report
    assert result["audit_gaps"] == 0 and result["audit_duplicates"] == 0, report
    assert result["audit_chain_ok"]
    assert result["duplicate_starts"] == 0, report
    assert result["orphan_processes"] == 0, report
    assert result["decisions_sent"] >= 4  # dispatches, a rejection and escalations
    assert result["decisions_applied"] == result["decisions_sent"], report
    assert result["training_run"] == "finished"
    assert result["trainer_starts"] == 1 and result["agent_starts"] >= 3
