"""Summary statistics for gate samples: median, bootstrap confidence interval, CV, binomial bounds."""

from dataclasses import dataclass

import numpy as np

# A fixed seed: re-deriving a verdict from stored samples must give the same interval.
BOOTSTRAP_SEED = 20260712
BOOTSTRAP_RESAMPLES = 4999


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    ci_low: float
    ci_high: float
    cv: float
    method: str


def summarize(samples: list[float], confidence: float = 0.90) -> Summary:
    """Median with a percentile-bootstrap CI of the median, and the coefficient of variation.

    One sample, or samples that are all equal, are an exact measurement: the interval is the value itself.
    """
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        raise ValueError("cannot summarize zero samples")
    median = float(np.median(values))
    mean = float(np.mean(values))
    cv = float(np.std(values, ddof=1) / abs(mean)) if values.size > 1 and mean != 0 else 0.0
    if values.size == 1 or np.all(values == values[0]):
        return Summary(int(values.size), median, median, median, cv, "exact")
    from scipy import (
        stats,
    )  # deferred: scipy.stats costs a second at import, and most CLI commands never need it

    result = stats.bootstrap(
        (values,),
        np.median,
        confidence_level=confidence,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
    low, high = result.confidence_interval
    return Summary(
        int(values.size), median, float(low), float(high), cv, f"bootstrap-median-{confidence:.0%}"
    )


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
