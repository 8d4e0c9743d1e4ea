"""Simulated coverage of every interval method the gates use, n = 3..30, on skewed and heavy-tailed samples.

Each cell is the fraction of simulated experiments whose interval covered the true value; "-" where the method
gives no interval at that n (the verdict is INCONCLUSIVE with the rounds it needs). The percentile bootstrap
row is the method the gates used before, kept for reference and excluded from the worst figure.
Writes bench/results/coverage.json with `nominal` and `worst_coverage_n5_to_30` (gate methods only), and
`p99_interval`: the coverage of the p99 interval that bench/lifecycle.py reports, at its sample sizes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from daedalus.gates import coverage
from daedalus.gates.statistics import quantile_ranks
from record import Recording

NOMINAL = 0.90
NS = (3, 4, 5, 6, 7, 10, 15, 20, 30)
P99_NS = (125, 250, 500, 1000)  # decides one way in bench/lifecycle.py (125: its default before it had this)
P99_REPS = 4_000
REPS = 20_000
BOOTSTRAP_REPS = 2_000
OUT = Path(__file__).parent / "results" / "coverage.json"


def main() -> dict[str, object]:
    recording = Recording.start()
    rng = np.random.default_rng(20261130)
    rows: dict[str, dict[int, float | None]] = {}
    for dist in coverage.DISTRIBUTIONS:
        rows[f"median order-statistic | {dist.name}"] = {
            n: coverage.median_coverage(dist, n, NOMINAL, REPS, rng) for n in NS
        }
    for dist in coverage.DISTRIBUTIONS:
        rows[f"A/B paired-ratio median | {dist.name}"] = {
            n: coverage.paired_ratio_coverage(dist, n, NOMINAL, REPS, rng) for n in NS
        }
    rows["Clopper-Pearson | worst over p in (0,1), exact"] = {
        n: coverage.clopper_pearson_coverage(n, NOMINAL) for n in NS
    }
    for dist in coverage.DISTRIBUTIONS[:4]:
        rows[f"KiB/token slope t-interval (n contexts) | {dist.name}"] = {
            n: coverage.slope_coverage(dist, n, NOMINAL, REPS, rng) for n in NS
        }
    for tokens in (512, 2048):
        value = coverage.perplexity_delta_coverage(tokens, NOMINAL, 2_000, rng)
        rows[f"dPPL +/- (quadrature, normal) | {tokens} scored tokens, independent"] = {
            n: None for n in NS
        } | {5: value}
    reference: dict[str, dict[int, float | None]] = {}
    for dist in coverage.DISTRIBUTIONS[:3]:
        reference[f"(reference, unused) percentile bootstrap | {dist.name}"] = {
            n: coverage.percentile_bootstrap_coverage(dist, n, NOMINAL, BOOTSTRAP_REPS, rng) for n in NS
        }

    table = Table(title=f"simulated coverage of {NOMINAL:.0%} intervals ({REPS:,} experiments a cell)")
    table.add_column("method | sampling distribution")
    for n in NS:
        table.add_column(f"n={n}", justify="right")
    for name, cells in {**rows, **reference}.items():
        table.add_row(name, *(f"{cells[n]:.3f}" if cells.get(n) is not None else "-" for n in NS))
    Console(width=200).print(table)
    print(
        "dPPL rows: one llama-perplexity run pair each (n does not apply); shown under n=5.", file=sys.stderr
    )

    in_range = [
        (value, name, n)
        for name, cells in rows.items()
        for n, value in cells.items()
        if value is not None and 5 <= n <= 30
    ]
    worst, worst_name, worst_n = min(in_range)
    figures: dict[str, object] = {
        "nominal": NOMINAL,
        "worst_coverage_n5_to_30": worst,
        "worst_cell": f"{worst_name} at n={worst_n}",
        "experiments_per_cell": REPS,
        "monte_carlo_se_at_nominal": float(np.sqrt(NOMINAL * (1 - NOMINAL) / REPS)),
        "table": {
            name: {str(n): v for n, v in cells.items()} for name, cells in {**rows, **reference}.items()
        },
    }
    print(f"worst coverage over gate methods, n=5..30: {worst:.4f} ({worst_name} at n={worst_n})")
    figures["p99_interval"] = p99_interval(rng)
    recording.write(figures, OUT)
    return figures


def p99_interval(rng: np.random.Generator) -> dict[str, dict[str, object]]:
    """The order-statistic interval of a p99 (latencies): simulated vs claimed coverage, and whether the sample
    size gives it an upper bound at all."""
    table = Table(title=f"p99 order-statistic {NOMINAL:.0%} interval ({P99_REPS:,} experiments a cell)")
    for column in ("sampling distribution", "n", "ranks (low, high)", "claimed", "simulated"):
        table.add_column(column, justify="right")
    cells: dict[str, dict[str, object]] = {}
    for dist in coverage.LATENCY_LIKE:
        for n in P99_NS:
            ranks = quantile_ranks(n, 0.99, NOMINAL)
            simulated, claimed = coverage.quantile_coverage(dist, n, 0.99, NOMINAL, P99_REPS, rng)
            high = "unbounded" if ranks.high is None else str(ranks.high)
            table.add_row(dist.name, str(n), f"{ranks.low}, {high}", f"{claimed:.3f}", f"{simulated:.3f}")
            cells[f"{dist.name} | n={n}"] = {
                "low_rank": ranks.low,
                "high_rank": ranks.high,
                "claimed": round(claimed, 4),
                "simulated": round(simulated, 4),
            }
    Console(width=200).print(table)
    return cells


if __name__ == "__main__":
    main()
