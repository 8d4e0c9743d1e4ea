"""The gates' intervals keep their promise, proved by simulation on skewed and heavy-tailed samples.

Tolerance: 20,000 simulated experiments per cell give a Monte Carlo standard error of 0.0021 at 90%; a method
passes when its coverage is >= nominal - 0.01 (about 5 standard errors), for every n from 5 to 30. Below the
n that the confidence allows (n < 5 at 90%), the method must give no interval at all.
"""

import numpy as np
import pytest

from daedalus.gates import coverage
from daedalus.gates.statistics import (
    min_rounds,
    order_statistic_ranks,
    quantile_interval,
    quantile_ranks,
    summarize,
)
from daedalus.gates.verdicts import judge
from daedalus.schemas.gates import GateMeasurement, GateSpec, Verdict

NOMINAL = 0.90
TOLERANCE = 0.01
REPS = 20_000
NS = range(3, 31)
SKEWED_AND_HEAVY = [d for d in coverage.DISTRIBUTIONS if d.name != "normal"]


@pytest.mark.parametrize("dist", SKEWED_AND_HEAVY, ids=lambda d: d.name)
def test_median_interval_covers_at_every_n(dist: coverage.Distribution) -> None:
    rng = np.random.default_rng(1)
    for n in NS:
        simulated = coverage.median_coverage(dist, n, NOMINAL, REPS, rng)
        if n < 5:
            assert simulated is None, f"n={n} must give no 90% interval"
            continue
        assert simulated is not None and simulated >= NOMINAL - TOLERANCE, (dist.name, n, simulated)
        # The coverage the method claims is the coverage it gets (to Monte Carlo error).
        ranks = order_statistic_ranks(n, NOMINAL)
        assert ranks is not None and abs(simulated - ranks[1]) < 5 * np.sqrt(NOMINAL * 0.1 / REPS) + 0.005


@pytest.mark.parametrize("dist", SKEWED_AND_HEAVY, ids=lambda d: d.name)
def test_paired_ratio_interval_covers(dist: coverage.Distribution) -> None:
    rng = np.random.default_rng(2)
    for n in (5, 6, 7, 10, 20, 30):
        simulated = coverage.paired_ratio_coverage(dist, n, NOMINAL, REPS, rng)
        assert simulated is not None and simulated >= NOMINAL - TOLERANCE, (dist.name, n, simulated)


def test_clopper_pearson_covers_for_every_p() -> None:
    for n in NS:
        assert coverage.clopper_pearson_coverage(n, NOMINAL) >= NOMINAL - 1e-9, n


def test_the_old_percentile_bootstrap_undercovers_where_the_issue_says() -> None:
    # The reason for the change, checked so it can fail: a 90% percentile bootstrap covers ~75% at n=3.
    rng = np.random.default_rng(3)
    lognormal = coverage.DISTRIBUTIONS[1]
    assert coverage.percentile_bootstrap_coverage(lognormal, 3, NOMINAL, 2_000, rng) < 0.82


def test_too_few_rounds_is_inconclusive_with_the_rounds_needed() -> None:
    # Three rounds of 55.6/56.0/56.3 against ">= 55": the data can only say ~75%, not 90%.
    assert min_rounds(0.90) == 5 and min_rounds(0.95) == 6
    gate = GateSpec(name="decode", metric="decode_tps", threshold=55, command="x")
    result = judge(gate, GateMeasurement(samples=[55.6, 56.0, 56.3]))
    assert result.verdict is Verdict.INCONCLUSIVE and result.rounds_needed == 2
    assert "needs 2 more rounds" in result.reason and result.ci_low is None
    five = judge(gate, GateMeasurement(samples=[55.6, 56.0, 56.3, 55.9, 56.1]))
    assert five.verdict is Verdict.PASS and five.ci_low == 55.6 and five.ci_high == 56.3


def test_one_sample_never_gets_a_zero_width_interval() -> None:
    summary = summarize([27.0])
    assert summary.ci_low is None and summary.rounds_needed == 4
    ppl = GateSpec(name="ppl", metric="ppl_delta_pct", threshold=1.0, command="x")
    assert judge(ppl, GateMeasurement(samples=[0.9])).verdict is Verdict.INCONCLUSIVE


def test_wider_intervals_as_n_grows_use_inner_order_statistics() -> None:
    ranks = order_statistic_ranks(30, NOMINAL)
    assert ranks is not None and ranks[0] == 11 and ranks[1] >= NOMINAL
    assert order_statistic_ranks(4, NOMINAL) is None


@pytest.mark.parametrize("dist", coverage.DISTRIBUTIONS[1:4], ids=lambda d: d.name)
def test_kib_per_token_slope_interval_covers(dist: coverage.Distribution) -> None:
    rng = np.random.default_rng(4)
    for n in (5, 6, 8):
        simulated = coverage.slope_coverage(dist, n, NOMINAL, REPS, rng)
        assert simulated is not None and simulated >= NOMINAL - TOLERANCE - 0.02, (dist.name, n, simulated)


TAIL_REPS = 4_000  # a p99 of 500 samples: 2M draws per cell; the Monte Carlo s.e. is 0.0043 at 92%


@pytest.mark.parametrize("dist", coverage.LATENCY_LIKE, ids=lambda d: d.name)
def test_a_p99_interval_covers_what_it_claims(dist: coverage.Distribution) -> None:
    # bench/lifecycle.py's p99 with its 90% interval, at 125, 250 and 500 decides back to back.
    rng = np.random.default_rng(4)
    for n in (125, 250, 500):
        simulated, claimed = coverage.quantile_coverage(dist, n, 0.99, NOMINAL, TAIL_REPS, rng)
        error = 5 * np.sqrt(claimed * (1 - claimed) / TAIL_REPS)
        assert claimed >= NOMINAL and abs(simulated - claimed) < error, (dist.name, n, simulated, claimed)


def test_a_p99_of_too_few_samples_has_no_upper_bound() -> None:
    # All n samples fall below the true p99 with probability 0.99^n: more than 5% until n = 299.
    assert quantile_ranks(298, 0.99, NOMINAL).high is None
    assert quantile_ranks(299, 0.99, NOMINAL).high == 299
    assert quantile_ranks(500, 0.99, NOMINAL).high == 499
    assert quantile_interval([float(x) for x in range(1, 501)], 0.99) == (491.0, 499.0)
    # At q = 1/2 the ranks are the median interval's own.
    ranks, median = quantile_ranks(30, 0.5, NOMINAL), order_statistic_ranks(30, NOMINAL)
    assert median is not None and (ranks.low, ranks.high) == (median[0], 31 - median[0])
