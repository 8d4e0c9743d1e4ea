"""Simulated coverage of every interval the gates use: does a "90% interval" cover the truth 90% of the time?

Vectorised numpy: each function draws `reps` whole experiments at once and returns the fraction whose interval
covered the true value. `bench/coverage.py` prints the table; tests/gates/test_coverage.py holds the methods
to their promise. The simulations are of the statistics, not of the engines: the perplexity row assumes
llama-perplexity's per-token log-losses are independent, which real text only approximates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from daedalus.gates.statistics import order_statistic_ranks, quantile_ranks

Draw = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


@dataclass(frozen=True)
class Distribution:
    """A sampling distribution with its true median; skewed and heavy-tailed ones are the test. `quantile`: its
    exact quantile function, for the latency-like ones whose tail intervals are simulated."""

    name: str
    draw: Draw
    median: float
    quantile: Callable[[float], float] | None = None


def _lognormal_quantile(q: float) -> float:
    from scipy import stats

    return float(stats.lognorm.ppf(q, 1.0))


def _exponential_quantile(q: float) -> float:
    return float(-np.log1p(-q))


DISTRIBUTIONS: tuple[Distribution, ...] = (
    Distribution("normal", lambda g, s: g.normal(56.0, 0.5, s), 56.0),
    Distribution(
        "lognormal(sigma=1), skewed", lambda g, s: g.lognormal(0.0, 1.0, s), 1.0, _lognormal_quantile
    ),
    Distribution(
        "exponential, skewed", lambda g, s: g.exponential(1.0, s), float(np.log(2)), _exponential_quantile
    ),
    Distribution("student t(2), heavy-tailed", lambda g, s: g.standard_t(2, s), 0.0),
    Distribution("cauchy, heavy-tailed", lambda g, s: g.standard_cauchy(s), 0.0),
    # One slow round in five (a noisy neighbour): skewed and bimodal.
    Distribution(
        "mixture: 20% slow rounds",
        lambda g, s: np.where(g.random(s) < 0.2, g.normal(40.0, 3.0, s), g.normal(56.0, 0.5, s)),
        float("nan"),  # computed numerically below
    ),
)


LATENCY_LIKE = tuple(d for d in DISTRIBUTIONS if d.quantile is not None)
"""Skewed to the right, as latencies are: the ones a p99 interval is simulated on."""


@functools.cache
def _mixture_median() -> float:
    from scipy import optimize, stats

    def cdf(x: float) -> float:
        return float(0.2 * stats.norm.cdf(x, 40.0, 3.0) + 0.8 * stats.norm.cdf(x, 56.0, 0.5) - 0.5)

    return float(optimize.brentq(cdf, 40.0, 60.0))


def true_median(dist: Distribution) -> float:
    return _mixture_median() if np.isnan(dist.median) else dist.median


def median_coverage(
    dist: Distribution, n: int, confidence: float, reps: int, rng: np.random.Generator
) -> float | None:
    """Coverage of the order-statistic median interval; None where n is too small to give one."""
    ranks = order_statistic_ranks(n, confidence)
    if ranks is None:
        return None
    r, _ = ranks
    samples = np.sort(dist.draw(rng, (reps, n)), axis=1)
    m = true_median(dist)
    return float(np.mean((samples[:, r - 1] <= m) & (samples[:, n - r] >= m)))


def quantile_coverage(
    dist: Distribution, n: int, q: float, confidence: float, reps: int, rng: np.random.Generator
) -> tuple[float, float]:
    """Coverage of the order-statistic interval for the q-quantile (a side the data cannot bound counts as
    unbounded), and the coverage `quantile_ranks` claims for it."""
    if dist.quantile is None:
        raise ValueError(f"{dist.name} has no exact quantile function")
    ranks = quantile_ranks(n, q, confidence)
    samples = np.sort(dist.draw(rng, (reps, n)), axis=1)
    truth = dist.quantile(q)
    below = samples[:, ranks.low - 1] <= truth if ranks.low else np.ones(reps, dtype=bool)
    above = samples[:, ranks.high - 1] >= truth if ranks.high else np.ones(reps, dtype=bool)
    return float(np.mean(below & above)), ranks.achieved


def paired_ratio_coverage(
    dist: Distribution, n: int, confidence: float, reps: int, rng: np.random.Generator
) -> float | None:
    """Coverage of the median interval on paired candidate/baseline ratios.

    Each round has a shared effect (machine load, hitting both sides of the pair) and each side its own noise
    drawn from `dist` (shifted positive); the true median ratio is the ratio of the sides' levels, because the
    two sides' noises are exchangeable.
    """
    ranks = order_statistic_ranks(n, confidence)
    if ranks is None:
        return None
    r, _ = ranks
    level_c, level_b = 0.85, 1.0  # the seed's 6f: MTP k=1 at ~0.85x AR
    shared = rng.lognormal(0.0, 0.2, (reps, n))

    def noise() -> np.ndarray:
        raw = dist.draw(rng, (reps, n))
        return np.exp(np.clip(raw - true_median(dist), -50, 50) * 0.05)

    ratios = np.sort((level_c * shared * noise()) / (level_b * shared * noise()), axis=1)
    truth = level_c / level_b
    return float(np.mean((ratios[:, r - 1] <= truth) & (ratios[:, n - r] >= truth)))


def clopper_pearson_coverage(n: int, confidence: float, grid: int = 199) -> float:
    """Exact worst-case coverage of Clopper-Pearson over true proportions p in (0, 1), for n trials."""
    from scipy import stats

    k = np.arange(n + 1)
    alpha = 1 - confidence
    low = np.where(k == 0, 0.0, stats.beta.ppf(alpha / 2, np.maximum(k, 1), n - k + 1))
    high = np.where(k == n, 1.0, stats.beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1)))
    ps = np.linspace(0.005, 0.995, grid)
    pmf = stats.binom.pmf(k[None, :], n, ps[:, None])
    covered = (low[None, :] <= ps[:, None]) & (ps[:, None] <= high[None, :])
    return float(np.min(np.sum(pmf * covered, axis=1)))


def slope_coverage(
    dist: Distribution, n: int, confidence: float, reps: int, rng: np.random.Generator
) -> float | None:
    """Coverage of the least-squares slope's t interval (KiB/token over n context sizes).

    Memory = fixed + slope x context + noise, the noise drawn from `dist` (centred on its median, scaled to
    about 2 MiB: allocator and page granularity). Needs n >= 3 for one residual degree of freedom.
    """
    if n < 3:
        return None
    from scipy import stats

    contexts = np.linspace(1024, 8192, n)
    slope_mib = 68.0 / 1024  # the seed's f16: 68 KiB/token
    noise = (dist.draw(rng, (reps, n)) - true_median(dist)) * 2.0
    memory = 500.0 + slope_mib * contexts[None, :] + noise
    x = contexts - contexts.mean()
    sxx = float(np.sum(x**2))
    fitted = (memory - memory.mean(axis=1, keepdims=True)) @ x / sxx
    intercept = memory.mean(axis=1) - fitted * contexts.mean()
    residuals = memory - (intercept[:, None] + fitted[:, None] * contexts[None, :])
    se = np.sqrt(np.sum(residuals**2, axis=1) / (n - 2) / sxx)
    half = stats.t.ppf(0.5 + confidence / 2, n - 2) * se
    return float(np.mean(np.abs(fitted - slope_mib) <= half))


def perplexity_delta_coverage(tokens: int, confidence: float, reps: int, rng: np.random.Generator) -> float:
    """Coverage of dPPL% +/- z x (both runs' errors in quadrature), llama-perplexity's error formula.

    Per-token log-losses are gamma-distributed (skewed); the candidate's are the baseline's plus a small
    quantisation penalty, so the two runs are positively correlated and quadrature is conservative.
    """
    from scipy import stats

    base = rng.gamma(2.0, 0.9, (reps, tokens))
    penalty_mean = 0.01
    cand = base + rng.normal(penalty_mean, 0.05, (reps, tokens))

    def ppl_and_err(nll: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean = nll.mean(axis=1)
        ppl = np.exp(mean)
        return ppl, ppl * nll.std(axis=1, ddof=1) / np.sqrt(tokens)

    ppl_c, err_c = ppl_and_err(cand)
    ppl_b, err_b = ppl_and_err(base)
    delta = (ppl_c / ppl_b - 1) * 100
    delta_err = (ppl_c / ppl_b) * np.sqrt((err_c / ppl_c) ** 2 + (err_b / ppl_b) ** 2) * 100
    truth = (np.exp(penalty_mean) - 1) * 100  # the expected per-token penalty, as a PPL ratio
    z = stats.norm.ppf(0.5 + confidence / 2)
    return float(np.mean(np.abs(delta - truth) <= z * delta_err))


def percentile_bootstrap_coverage(
    dist: Distribution, n: int, confidence: float, reps: int, rng: np.random.Generator, resamples: int = 400
) -> float:
    """For reference only (no gate uses it any more): the percentile bootstrap of the median."""
    samples = dist.draw(rng, (reps, n))
    picks = rng.integers(0, n, (reps, resamples, n))
    medians = np.median(np.take_along_axis(samples[:, None, :].repeat(resamples, 1), picks, axis=2), axis=2)
    alpha = 1 - confidence
    low = np.quantile(medians, alpha / 2, axis=1)
    high = np.quantile(medians, 1 - alpha / 2, axis=1)
    m = true_median(dist)
    return float(np.mean((low <= m) & (m <= high)))
