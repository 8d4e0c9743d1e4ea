"""Memory readings and the leak slope, on synthetic series shaped like the seed's runs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from daedalus.schemas.training import GIB, MIB, StopReason, WatchdogPolicy
from daedalus.training.memory import (
    HostMemory,
    Nvml,
    ProcessTreeMemory,
    read_counter_file,
    read_psi_some_avg10,
)
from daedalus.training.stop_rule import StopRule

SEED_POLICY = WatchdogPolicy()  # the seed's guard rails: 14 GiB, 2 samples, 15-minute window


def series(
    rate_gib_per_h: float, seconds: int, step_s: float, seed: int, start_gib: float = 75.0
) -> np.ndarray:
    """Available memory falling at `rate` with 0.3 GiB of noise and rare 3 GiB spikes (a loader, a cache)."""
    rng = np.random.default_rng(seed)
    t = np.arange(0, seconds, step_s)
    y = start_gib - rate_gib_per_h * t / 3600 + rng.normal(0, 0.3, t.size)
    spikes = rng.random(t.size) < 0.01
    y[spikes] -= 3.0
    return np.column_stack([t, y * GIB])


@pytest.mark.parametrize("seed", range(5))
def test_19_gib_per_hour_is_flagged_within_15_minutes(seed: int) -> None:
    rule = StopRule(SEED_POLICY)
    flagged_at = None
    for t, y in series(19.0, 900, 1.0, seed):
        assert rule.observe(float(t), int(y)) is None  # 75 GiB falling 4.75 GiB: nowhere near 14 GiB
        if rule.leak_flagged and flagged_at is None:
            flagged_at = t
    assert flagged_at is not None and flagged_at <= 900
    assert rule.fit is not None and 15 < rule.fit.leak_gib_per_h < 23


@pytest.mark.parametrize("seed", range(2))
def test_0065_gib_per_hour_is_never_flagged(seed: int) -> None:
    # Four hours of train8 (stable at 75 GB), sampled every 10 s to keep the test quick.
    rule = StopRule(SEED_POLICY)
    for t, y in series(0.065, 4 * 3600, 10.0, seed):
        assert rule.observe(float(t), int(y)) is None
        assert not rule.leak_flagged, f"flagged a 0.065 GiB/h run at t={t}"


def test_threshold_needs_consecutive_samples() -> None:
    rule = StopRule(SEED_POLICY)
    low, high = int(13.5 * GIB), int(20 * GIB)
    assert rule.observe(0, high) is None
    assert rule.observe(1, low) is None  # one dip is not a stop
    assert rule.observe(2, high) is None
    assert rule.observe(3, low) is None
    assert rule.observe(4, low) is StopReason.THRESHOLD


def test_projection_stops_before_the_threshold() -> None:
    policy = SEED_POLICY.model_copy(update={"projection_horizon_s": 600.0})
    rule = StopRule(policy)
    reason = None
    stopped_at = None
    for t, y in series(60.0, 3600, 1.0, seed=7, start_gib=40.0):
        reason = rule.observe(float(t), int(y))
        if reason is not None:
            stopped_at = t
            break
    assert reason is StopReason.PROJECTED
    assert stopped_at is not None
    # 60 GiB/h from 40 GiB hits 14 GiB at 26 min; a 10-minute horizon stops it around 16 min, well before.
    assert 600 < stopped_at < 26 * 60 - 300


def test_process_tree_reading_follows_the_trainer() -> None:
    code = "import time; b = bytearray(b'x') * (64 * 1024 * 1024); print('ok', flush=True); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ok"
        reader = ProcessTreeMemory(proc.pid, 400 * MIB)
        used = reader.used_bytes()
        assert 64 * MIB < used < 200 * MIB
        assert reader.available_bytes() == pytest.approx(400 * MIB - used, abs=8 * MIB)
    finally:
        proc.kill()
        proc.wait()
    assert ProcessTreeMemory(proc.pid, 400 * MIB).used_bytes() == 0  # gone: nothing used, no crash


def test_host_reading_is_sane() -> None:
    assert HostMemory().available_bytes() > 0


def test_missing_proc_readings_fall_back_to_none(tmp_path: Path) -> None:
    assert read_psi_some_avg10(tmp_path / "absent") is None
    assert read_counter_file(tmp_path / "absent") is None
    garbled = tmp_path / "pressure"
    garbled.write_text("some avg10=x avg60=0\n")
    assert read_psi_some_avg10(garbled) is None
    good = tmp_path / "pressure2"
    good.write_text(
        "some avg10=1.25 avg60=0.00 avg300=0.00 total=5\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert read_psi_some_avg10(good) == 1.25
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 4\n")
    assert read_counter_file(vmstat) == 4


def test_nvml_without_pynvml_reads_nothing() -> None:
    nvml = Nvml()
    if nvml.status == "ok":
        pytest.skip("pynvml works here")
    assert nvml.used_bytes() is None


def test_fit_cost_stays_flat() -> None:
    rule = StopRule(SEED_POLICY)
    data = series(19.0, 900, 0.1, seed=1)  # 10 Hz
    start = time.process_time()
    for t, y in data:
        rule.observe(float(t), int(y))
    assert time.process_time() - start < 20.0  # loose: a per-sample O(n^2) fit would take minutes
