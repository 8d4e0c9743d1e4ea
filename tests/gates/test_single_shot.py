"""Single-shot metrics carry their own uncertainty, or are declared exact, and the verdict says which."""

from pathlib import Path

import pytest

from daedalus.engines.capacity import fit_kib_per_token
from daedalus.engines.measure import capacity_measurement
from daedalus.errors import EngineError
from daedalus.gates.verdicts import judge
from daedalus.schemas.engines import CapacityResult, KvMeasurement
from daedalus.schemas.gates import GateMeasurement, GateSpec, Metric, Verdict


def gate(metric: str, threshold: float, **extra: object) -> GateSpec:
    return GateSpec.model_validate(
        {"name": metric, "metric": metric, "threshold": threshold, "command": "x", **extra}
    )


def test_perplexity_delta_uses_its_own_error() -> None:
    # +0.9% against "<= 1%" with llama-perplexity's +/- 0.5 (one standard error): the data cannot say.
    ppl = gate("ppl_delta_pct", 1.0)
    unsure = judge(ppl, GateMeasurement(samples=[0.9], standard_error=0.5))
    assert unsure.verdict is Verdict.INCONCLUSIVE
    assert unsure.ci_low is not None and unsure.ci_high is not None
    assert unsure.ci_high == pytest.approx(0.9 + 1.6449 * 0.5, abs=1e-3) and "standard error" in unsure.method
    assert judge(ppl, GateMeasurement(samples=[0.48], standard_error=0.2)).verdict is Verdict.PASS
    assert judge(ppl, GateMeasurement(samples=[4.12], standard_error=0.3)).verdict is Verdict.FAIL
    # Without its error, one run is not enough to judge.
    assert judge(ppl, GateMeasurement(samples=[0.48])).verdict is Verdict.INCONCLUSIVE


def test_a_standard_error_belongs_to_one_estimate() -> None:
    with pytest.raises(ValueError, match="single estimate"):
        GateMeasurement(samples=[1.0, 2.0], standard_error=0.1)


def test_engine_reported_counts_are_declared_deterministic() -> None:
    pool = judge(gate("kv_pool_tokens", 369_712), GateMeasurement(samples=[1_006_896.0]))
    assert (
        pool.verdict is Verdict.PASS
        and "deterministic" in pool.reason
        and "no sampling interval" in pool.reason
    )
    conc = judge(gate("max_concurrency", 16), GateMeasurement(samples=[12.0]))
    assert conc.verdict is Verdict.FAIL and "deterministic" in conc.reason
    # Two readings of a deterministic count that disagree mean the measurement is not what it claims.
    drift = judge(gate("kv_pool_tokens", 1), GateMeasurement(samples=[100.0, 101.0]))
    assert drift.verdict is Verdict.INVALID and "exact count" in drift.reason


def test_kib_per_token_is_a_slope_with_its_fit_error() -> None:
    # 68 KiB/token (the seed's f16) over four contexts, with a little allocator noise.
    points = [(1024, 0.4), (2048, -0.3), (4096, 0.2), (8192, -0.1)]
    measurements = [
        KvMeasurement(preset="f16", context=ctx, rss_mib=500 + 68 * ctx / 1024 + noise)
        for ctx, noise in points
    ]
    slope, se, dof = fit_kib_per_token(measurements)
    assert slope == pytest.approx(68.0, rel=0.01) and 0 < se < 0.5 and dof == 2
    with pytest.raises(EngineError, match="at least 3 different context sizes"):
        fit_kib_per_token(measurements[:2])
    cap = CapacityResult(
        preset="f16", measurements=measurements, contexts=[1024, 2048, 4096, 8192], kib_per_token=slope,
        kib_per_token_se=se, fit_dof=dof,
    )  # fmt: skip
    measured = capacity_measurement(Metric.KIB_PER_TOKEN, cap, artifact=Path("/a"))
    assert measured.standard_error == se and measured.error_dof == 2
    result = judge(gate("kib_per_token", 70.0), measured)
    assert result.verdict is Verdict.PASS and result.ci_high is not None and result.ci_high < 70
    assert "t, 2 dof" in result.method
    # A flat curve measures nothing: INVALID, not a KiB/token of 0 that passes any "<=" gate.
    flat = cap.model_copy(update={"compression": None, "compression_se": None})
    assert capacity_measurement(Metric.COMPRESSION, flat, artifact=Path("/a")).invalid_reason
