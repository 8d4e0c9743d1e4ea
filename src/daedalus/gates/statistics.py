"""Intervals a gate can trust: order-statistic intervals (the median, any quantile), Clopper-Pearson, stated errors.

Every interval here keeps its promise; `bench/coverage.py` and tests/gates/test_coverage.py check it by
simulation. The percentile bootstrap this module used before covered ~75% at n=3 when it claimed 90%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    """A metric's point estimate and its interval, or why there is no interval yet.

    `ci_low`/`ci_high` are None when the data cannot support the asked confidence; `rounds_needed` then says
    how many more samples would. `achieved` is the interval's actual coverage (>= the confidence asked).
    """

    n: int
    median: float
    ci_low: float | None
    ci_high: float | None
    cv: float
    method: str
    rounds_needed: int = 0
    achieved: float | None = None


def _binom_half_cdf(k: int, n: int) -> float:
    """P(B <= k) for B ~ Binomial(n, 1/2), exactly (n is a round count: small)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2**n


def order_statistic_ranks(n: int, confidence: float) -> tuple[int, float] | None:
    """The narrowest symmetric ranks (r, n+1-r), 1-based, whose interval covers the median with at least
    `confidence`, and that coverage; None when even [min, max] falls short (n < 5 at 90%).

    P(x_(r) <= median <= x_(n+1-r)) = 1 - 2 P(B <= r-1) with B ~ Binomial(n, 1/2), for any continuous
    distribution: the interval is distribution-free, and ties only make it more conservative.
    """
    best: tuple[int, float] | None = None
    for r in range(1, n // 2 + 1):
        coverage = 1.0 - 2.0 * _binom_half_cdf(r - 1, n)
        if coverage < confidence:
            break
        best = (r, coverage)
    return best


@dataclass(frozen=True)
class QuantileRanks:
    """1-based ranks of the order statistics that bound a quantile, and the interval's exact coverage.

    `low`/`high` are None where the sample cannot bound the quantile on that side: a p99 of 250 samples has
    no 90% upper bound, because all 250 fall below the true p99 with probability 0.99^250 = 8% > 5%."""

    low: int | None
    high: int | None
    achieved: float


def quantile_ranks(n: int, q: float, confidence: float) -> QuantileRanks:
    """The equal-tailed distribution-free interval x_(low) <= quantile q <= x_(high) of n samples.

    The number K of samples below the true q-quantile is Binomial(n, q) for any continuous distribution, and
    P(x_(l) <= xi_q <= x_(u)) = P(l <= K <= u - 1): each bound is the innermost rank whose tail is at most
    (1 - confidence) / 2. It generalizes `order_statistic_ranks` (q = 1/2) to a latency's p99; the gates keep
    that one, exact in integers, because scipy costs a second to import on the path of every gate."""
    if not 0 < q < 1 or n < 1:
        raise ValueError(f"need 0 < q < 1 and n >= 1; got q={q}, n={n}")
    from scipy import stats

    tail = (1.0 - confidence) / 2
    below = stats.binom.cdf(np.arange(n), n, q)  # below[r - 1] = P(K <= r - 1) for rank r
    lows = np.flatnonzero(below <= tail)
    highs = np.flatnonzero(1.0 - below <= tail)
    low = int(lows[-1]) + 1 if lows.size else None
    high = int(highs[0]) + 1 if highs.size else None
    achieved = (below[high - 1] if high else 1.0) - (below[low - 1] if low else 0.0)
    return QuantileRanks(low, high, float(achieved))


def quantile_interval(
    samples: list[float], q: float, confidence: float = 0.90
) -> tuple[float | None, float | None]:
    """The sample's distribution-free interval for its q-quantile (None: the data cannot bound that side)."""
    values = sorted(samples)
    ranks = quantile_ranks(len(values), q, confidence)
    return (
        values[ranks.low - 1] if ranks.low else None,
        values[ranks.high - 1] if ranks.high else None,
    )


def min_rounds(confidence: float) -> int:
    """The fewest samples whose [min, max] covers the median with `confidence` (5 at 90%, 6 at 95%)."""
    n = 1
    while 1.0 - 2.0 ** (1 - n) < confidence:
        n += 1
    return n


def coefficient_of_variation(values: np.ndarray) -> float:
    mean = float(np.mean(values))
    return float(np.std(values, ddof=1) / abs(mean)) if values.size > 1 and mean != 0 else 0.0


def summarize(samples: list[float], confidence: float = 0.90) -> Summary:
    """Median with its distribution-free order-statistic interval, and the coefficient of variation.

    Too few samples for the confidence asked give no interval and the number of rounds still needed;
    no sample count ever gets a zero-width interval by fiat.
    """
    values = np.sort(np.asarray(samples, dtype=float))
    if values.size == 0:
        raise ValueError("cannot summarize zero samples")
    n = int(values.size)
    median = float(np.median(values))
    cv = coefficient_of_variation(values)
    ranks = order_statistic_ranks(n, confidence)
    if ranks is None:
        needed = min_rounds(confidence)
        return Summary(
            n, median, None, None, cv,
            f"order-statistic median CI needs n >= {needed} at {confidence:.0%}; have {n}",
            rounds_needed=needed - n,
        )  # fmt: skip
    r, achieved = ranks
    return Summary(
        n, median, float(values[r - 1]), float(values[n - r]), cv,
        f"order-statistic median CI x({r})..x({n + 1 - r}) of {n} (binomial), {achieved:.1%} >= {confidence:.0%}",
        achieved=achieved,
    )  # fmt: skip


def interval_from_error(
    value: float, standard_error: float, confidence: float = 0.90, *, dof: int | None = None
) -> tuple[float, float]:
    """A two-sided interval from an estimate's own standard error: normal, or Student t with `dof`
    degrees of freedom (a fit's residual dof). Used where the tool reports its error (llama-perplexity's
    +/-, a regression slope's standard error)."""
    if standard_error < 0 or not math.isfinite(standard_error):
        raise ValueError(f"a standard error must be finite and >= 0; got {standard_error}")
    if dof is not None and dof < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom; got {dof}")
    from scipy import stats  # deferred: scipy.stats costs a second at import, and most commands never need it

    quantile = stats.norm.ppf if dof is None else (lambda q: stats.t.ppf(q, dof))
    half = float(quantile(0.5 + confidence / 2)) * standard_error
    return value - half, value + half


def paired_ratios(candidate: list[float], baseline: list[float]) -> list[float]:
    """Candidate/baseline ratios of interleaved A/B rounds (round i of each ran side by side)."""
    if len(candidate) != len(baseline):
        raise ValueError("paired samples must have equal length")
    if any(b == 0 for b in baseline):
        raise ValueError("a baseline sample of 0 has no ratio")
    return [c / b for c, b in zip(candidate, baseline, strict=True)]


def clopper_pearson(successes: int, trials: int, confidence: float = 0.90) -> tuple[float, float]:
    """Exact two-sided binomial interval: 3/3 at 90% only proves >= 0.368 (>= 0.29 at 95%)."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0; got {successes}/{trials}")
    from scipy import stats

    interval = stats.binomtest(successes, trials).proportion_ci(confidence_level=confidence, method="exact")
    return float(interval.low), float(interval.high)
