"""The pool as separate processes (bench/pool.py --quick): embedded Temporal, control worker, API and three host
workers; gates, an A/B pair, a training run and a tenant contending for one host's GPUs; a host worker
SIGKILLed while it holds a lease. No two jobs ever ran on one GPU at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH_LIMIT_S = 840
"""The bench's own limit, under pytest's for this test: a slow run fails with its output, not pytest's kill."""


@pytest.mark.timeout(BENCH_LIMIT_S + 60)
def test_the_pool_under_contention_and_a_killed_worker(tmp_path: Path) -> None:
    out = tmp_path / "pool.json"
    finished = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pool.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=BENCH_LIMIT_S,
        check=False,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["overlapping_gpu_leases"] == 0
    assert result["hosts"] == 3
    assert result["tenant_pauses"] >= 1 and result["tenant_pauses"] == result["tenant_resumes"]
    assert result["expired_leases"] >= 1 and result["expired_leases_recovered"] >= 1  # the killed worker's
    assert result["revoked_by_tenant"] and result["revoked_by_tenant"][0].startswith("training-")
    assert result["steps_revoked"] == 1 and result["steps_refused"] == 0
    # Every other step ran to its end, the killed worker's included (retried on the restarted worker).
    assert result["steps_run"] == result["steps_submitted"] - 1
    assert result["jobs_logged"] >= result["steps_submitted"]
    assert 0 < result["lease_grant_p50_ms"] <= result["lease_grant_p99_ms"]
    # The tickets' gates ran confined, under a lease, and judged the work their job measured.
    assert result["tickets_filed"] >= 2 and result["tickets_passed"] == result["tickets_filed"], result
    assert result["ticket_gates_under_lease"] == result["ticket_gates_run"] >= result["tickets_filed"]
    assert result["gate_jobs_logged"] >= result["tickets_filed"], "the gates' own job logs were gathered"
