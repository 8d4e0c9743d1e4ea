"""Turn a gate's measurement into a verdict, per MEASUREMENT.md.

Absolute gate: PASS if the whole confidence interval clears the threshold, FAIL if the whole interval misses
it, INCONCLUSIVE otherwise. A/B gate: the same rule on the paired candidate/baseline ratios. Validity comes
first: a measurement that broke is INVALID, never FAIL.
"""

from daedalus.gates.statistics import Summary, clopper_pearson, paired_ratios, summarize
from daedalus.schemas.gates import GateKind, GateMeasurement, GateResult, GateSpec, Metric, Verdict

# Metrics measured as one pass (1) or miss (0) per trial. A proportion is judged by its exact binomial
# interval, not by a bootstrap of the median: "3/3 needles" only proves >= 0.29 at 95%.
PROPORTION_METRICS = frozenset({Metric.NEEDLE, Metric.TEMP0_IDENTITY})


def invalid_reasons(gate: GateSpec, measurement: GateMeasurement) -> list[str]:
    reasons = []
    if measurement.invalid_reason:
        reasons.append(measurement.invalid_reason)
    if measurement.failed_requests:
        reasons.append(f"{measurement.failed_requests} failed requests")
    if measurement.token_count_mismatches:
        reasons.append(f"{measurement.token_count_mismatches} completions with the wrong token count")
    if measurement.preemptions > gate.allowed_preemptions:
        reasons.append(f"{measurement.preemptions} preemptions (allowed: {gate.allowed_preemptions})")
    if gate.kind is GateKind.AB and measurement.baseline_samples is None:
        reasons.append("an A/B gate needs baseline_samples paired with its samples")
    return reasons


def decide(gate: GateSpec, measurement: GateMeasurement, *, host: str = "", commit: str = "") -> GateResult:
    """The verdict of one gate on one measurement, with everything needed to re-derive it."""
    common = dict(
        gate=gate.name,
        metric=gate.metric,
        rule=gate.describe(),
        samples=measurement.samples,
        baseline_samples=measurement.baseline_samples,
        confidence=gate.confidence,
        unit=measurement.unit,
        host=host,
        commit=commit,
        evidence=measurement.evidence,
    )
    problems = invalid_reasons(gate, measurement)
    if problems:
        return GateResult(
            verdict=Verdict.INVALID,
            reason="measurement invalid: " + "; ".join(problems),
            method=measurement.method,
            **common,
        )
    values = (
        paired_ratios(measurement.samples, measurement.baseline_samples or [])
        if gate.kind is GateKind.AB
        else measurement.samples
    )
    summary = _proportion(values, gate) or summarize(values, gate.confidence)
    verdict = _judge(gate.comparator, gate.threshold, summary.ci_low, summary.ci_high)
    interval = f"[{summary.ci_low:.4g}, {summary.ci_high:.4g}]"
    reason = (
        f"median {summary.median:.4g}, {gate.confidence:.0%} CI {interval} over n={summary.n}, "
        f"CV {summary.cv:.1%}; rule {gate.describe()} -> {verdict.value}"
    )
    return GateResult(
        verdict=verdict,
        reason=reason,
        method=f"{measurement.method}; {summary.method}",
        median=summary.median,
        ci_low=summary.ci_low,
        ci_high=summary.ci_high,
        cv=summary.cv,
        **common,
    )


def _proportion(values: list[float], gate: GateSpec) -> Summary | None:
    """k/n with its Clopper-Pearson interval, for pass/miss metrics; None for anything else.

    A threshold of 1.0 ("every probe identical") is a deterministic claim: it passes on n/n and fails on any miss.
    """
    if (
        gate.metric not in PROPORTION_METRICS
        or gate.kind is GateKind.AB
        or any(v not in (0.0, 1.0) for v in values)
    ):
        return None
    k, n = int(sum(values)), len(values)
    if gate.threshold >= 1.0:
        return Summary(n, k / n, k / n, k / n, 0.0, f"exact {k}/{n}")
    low, high = clopper_pearson(k, n, gate.confidence)
    return Summary(n, k / n, low, high, 0.0, f"{k}/{n}, Clopper-Pearson {gate.confidence:.0%}")


def _judge(comparator: str, threshold: float, low: float, high: float) -> Verdict:
    if comparator == ">=":
        if low >= threshold:
            return Verdict.PASS
        return Verdict.FAIL if high < threshold else Verdict.INCONCLUSIVE
    if high <= threshold:
        return Verdict.PASS
    return Verdict.FAIL if low > threshold else Verdict.INCONCLUSIVE
