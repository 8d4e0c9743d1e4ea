"""How a gate decides (MEASUREMENT.md): the interval against the threshold, validity first."""

import subprocess
import sys

import pytest

from daedalus.gates.statistics import clopper_pearson
from daedalus.gates.test_count import measure
from daedalus.gates.verdicts import judge, rederive
from daedalus.schemas.gates import GateMeasurement, GateSpec, Verdict


def gate(**overrides: object) -> GateSpec:
    values: dict[str, object] = {"name": "decode", "metric": "decode_tps", "threshold": 55, "command": "x"}
    values.update(overrides)
    return GateSpec.model_validate(values)


def test_whole_interval_above_threshold_passes() -> None:
    result = judge(gate(), GateMeasurement(samples=[56.0, 56.2, 55.9, 56.1, 56.0, 55.8, 56.3]))
    assert result.verdict is Verdict.PASS
    assert result.ci_low is not None and result.ci_low >= 55 and result.median == 56.0


def test_whole_interval_below_threshold_fails() -> None:
    # Ticket 4 before the fix: 28.9 tok/s.
    result = judge(gate(), GateMeasurement(samples=[28.9, 29.1, 28.7, 28.8, 29.0, 28.9, 29.2]))
    assert result.verdict is Verdict.FAIL


def test_interval_straddling_threshold_is_inconclusive() -> None:
    result = judge(gate(), GateMeasurement(samples=[54.0, 56.2, 55.9, 56.1, 53.0, 55.8, 58.3]))
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.ci_low is not None and result.ci_high is not None
    assert result.ci_low < 55 <= result.ci_high


def test_lower_is_better_metric_uses_upper_bound() -> None:
    ttft = gate(metric="ttft_ms", threshold=1700)
    assert ttft.comparator == "<="
    assert judge(ttft, GateMeasurement(samples=[1000, 1100, 1050, 990, 1020])).verdict is Verdict.PASS
    assert judge(ttft, GateMeasurement(samples=[1900, 2000, 1950, 1990, 2020])).verdict is Verdict.FAIL


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("failed_requests", 2, "2 failed requests"),
        ("preemptions", 1, "1 preemptions"),
        ("token_count_mismatches", 3, "wrong token count"),
        ("invalid_reason", "server died mid-benchmark", "server died"),
    ],
)
def test_broken_measurement_is_invalid_never_fail(field: str, value: object, words: str) -> None:
    measurement = GateMeasurement.model_validate({"samples": [10.0, 10.0, 10.0], field: value})
    result = judge(gate(), measurement)
    assert result.verdict is Verdict.INVALID
    assert words in result.reason


def test_ab_gate_decides_on_paired_ratios() -> None:
    # Seed 6f: AR 294 vs MTP k=1 245-256 at 8 users -> MTP/AR ratio ~0.85, fails a ">= 1.0" claim.
    ab = gate(kind="ab", threshold=1.0)
    mtp, ar = [245.0, 250.0, 256.0, 248.0, 252.0], [294.0, 293.0, 296.0, 295.0, 292.0]
    result = judge(ab, GateMeasurement(samples=mtp, baseline_samples=ar))
    assert result.verdict is Verdict.FAIL
    assert result.median is not None and 0.83 < result.median < 0.87
    missing = judge(ab, GateMeasurement(samples=mtp))
    assert missing.verdict is Verdict.INVALID


def test_unpaired_ab_measurement_is_rejected() -> None:
    with pytest.raises(ValueError, match="one baseline sample per candidate"):
        GateMeasurement(samples=[1.0, 2.0], baseline_samples=[1.0])


def test_unknown_metric_is_rejected_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="decode_tps"):
        gate(metric="tokens_per_joule")


def test_verdict_is_rederivable_from_what_it_stores_and_not_from_the_order_of_rounds() -> None:
    samples = [56.0, 57.1, 55.2, 56.4, 55.9, 56.8, 56.1]
    first = judge(gate(), GateMeasurement(samples=samples))
    assert first.gate_spec is not None and first.measurement is not None  # what re-deriving needs is kept
    again = rederive(first)
    assert again.model_dump() == first.model_dump()
    shuffled = judge(gate(), GateMeasurement(samples=samples[::-1]))
    assert (shuffled.verdict, shuffled.median, shuffled.ci_low, shuffled.ci_high) == (
        first.verdict,
        first.median,
        first.ci_low,
        first.ci_high,
    )
    assert (first.ci_low, first.ci_high) == (55.2, 57.1)  # the order statistics for n=7 at 90%


def test_clopper_pearson_three_of_three() -> None:
    low, high = clopper_pearson(3, 3, confidence=0.95)
    assert round(low, 2) == 0.29 and high == 1.0
    with pytest.raises(ValueError):
        clopper_pearson(4, 3)


def test_test_count_reads_pytest_summary(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "test_two.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    assert False\n")
    done = subprocess.run(
        [sys.executable, "-m", "daedalus.gates.test_count", "--", sys.executable, "-m", "pytest", "-q", "-p",
         "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    measurement = GateMeasurement.model_validate_json(done.stdout.strip().splitlines()[-1])
    assert measurement.samples == [0.0] and measurement.evidence == {"passed": "1", "failed": "1"}
    assert measure("===== 27 passed in 3.1s =====", 0).samples == [27.0]
    assert measure("Segmentation fault", 139).invalid_reason is not None


def test_needle_is_judged_by_its_binomial_interval() -> None:
    needle = gate(name="needle", metric="needle", threshold=0.5)
    three_of_three = judge(needle, GateMeasurement(samples=[1.0, 1.0, 1.0]))
    # 3/3 at 90% only proves >= 0.46: not enough for a claim of >= 0.5.
    assert three_of_three.verdict is Verdict.INCONCLUSIVE and "3/3" in three_of_three.method
    assert judge(needle, GateMeasurement(samples=[1.0] * 12)).verdict is Verdict.PASS
    assert judge(needle, GateMeasurement(samples=[0.0] * 12)).verdict is Verdict.FAIL


def test_temp0_identity_at_one_is_exact() -> None:
    identity = gate(name="identity", metric="temp0_identity", threshold=1.0)
    assert judge(identity, GateMeasurement(samples=[1.0, 1.0, 1.0, 1.0])).verdict is Verdict.PASS
    assert judge(identity, GateMeasurement(samples=[1.0, 1.0, 0.0, 1.0])).verdict is Verdict.FAIL
