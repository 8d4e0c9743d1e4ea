"""Turn a gate's measurement into a verdict, per MEASUREMENT.md.

Absolute gate: PASS if the whole confidence interval clears the threshold, FAIL if the whole interval misses
it, INCONCLUSIVE otherwise — and INCONCLUSIVE, with the rounds still needed, when there are too few samples
for an interval at the confidence asked. A/B gate: the same rule on the paired candidate/baseline ratios.
Validity comes first: a measurement that broke is INVALID, never FAIL.

Where each interval comes from:
* repeated samples (throughput, latency, A/B ratios, KiB/token repeated): the median's order-statistic interval;
* one estimate with its own error (llama-perplexity's +/-, a fit slope): the normal or t interval of that error;
* pass/miss trials (needle, temp-0 identity): Clopper-Pearson;
* exact metrics (engine-reported counts, counted events): as observed, and the verdict says which it is.

Contention (gates/contention.py): a measurement carries the host's load during each measured round. An absolute
speed gate that would FAIL, or stay INCONCLUSIVE on its interval, while other work took a quarter of the host's
CPUs or more is INVALID with that reason; a PASS despite it stands; A/B gates keep their paired verdict. The load is in the result
either way (`host_load`, and each round in the evidence).
"""

from daedalus.gates import contention
from daedalus.gates.statistics import (
    Summary,
    clopper_pearson,
    interval_from_error,
    paired_ratios,
    summarize,
)
from daedalus.schemas.gates import (
    EXACT_METRICS,
    GateKind,
    GateMeasurement,
    GateResult,
    GateSpec,
    Metric,
    Verdict,
)

# Metrics measured as one pass (1) or miss (0) per trial. A proportion is judged by its exact binomial
# interval, not by an interval of the median: "3/3 needles" only proves >= 0.29 at 95%.
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
    if gate.metric in EXACT_METRICS and len(set(measurement.samples)) > 1:
        reasons.append(
            f"{gate.metric.value} is an exact count, but its readings differ: {measurement.samples}"
        )
    return reasons


def judge(gate: GateSpec, measurement: GateMeasurement, *, host: str = "", commit: str = "") -> GateResult:
    """The verdict of one gate on one measurement, with everything needed to re-derive it."""
    provenance = measurement.provenance
    if provenance is not None:
        provenance = provenance.model_copy(
            update={"host": host or provenance.host, "commit": commit or provenance.commit}
        )
    loads = contention.summary(measurement.host_load)
    common = dict(
        gate_spec=gate,
        measurement=measurement.model_copy(update={"evidence": {}, "provenance": provenance}),
        provenance=provenance,
        gate=gate.name,
        metric=gate.metric,
        rule=gate.describe(),
        samples=measurement.samples,
        baseline_samples=measurement.baseline_samples,
        standard_error=measurement.standard_error,
        error_dof=measurement.error_dof,
        confidence=gate.confidence,
        unit=measurement.unit,
        host=host,
        commit=commit,
        # The load's summary is evidence too: the store and the report keep evidence, not every field.
        evidence={**measurement.evidence, **({"host_load": loads} if loads else {})},
        host_load=loads,
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
    summary = (
        _exact(values, gate)
        or _proportion(values, gate)
        or _stated_error(values, measurement, gate)
        or summarize(values, gate.confidence)
    )
    if summary.ci_low is None or summary.ci_high is None:
        reason = (
            f"median {summary.median:.4g} over n={summary.n}: too few samples for a {gate.confidence:.0%} "
            f"interval ({summary.method}); needs {summary.rounds_needed} more rounds -> INCONCLUSIVE"
        )
        return GateResult(
            verdict=Verdict.INCONCLUSIVE,
            reason=reason,
            method=f"{measurement.method}; {summary.method}",
            median=summary.median,
            cv=summary.cv,
            rounds_needed=summary.rounds_needed,
            **common,
        )
    verdict = _judge(gate.comparator, gate.threshold, summary.ci_low, summary.ci_high)
    loaded = contention.judged_under_contention(
        gate, verdict, measurement.host_load, seen=measurement.evidence.get(contention.SEEN_KEY)
    )
    if gate.metric in EXACT_METRICS and gate.kind is GateKind.ABSOLUTE:
        stated = f"value {summary.median:.6g} ({EXACT_METRICS[gate.metric]}; no sampling interval)"
    else:
        interval = f"[{summary.ci_low:.4g}, {summary.ci_high:.4g}]"
        stated = f"median {summary.median:.4g}, {gate.confidence:.0%} CI {interval} over n={summary.n}"
        if summary.n > 1:
            stated += f", CV {summary.cv:.1%}"
    if loaded is not None:
        return GateResult(
            verdict=Verdict.INVALID,
            reason=f"measurement invalid: {loaded} ({stated})",
            method=f"{measurement.method}; {summary.method}",
            median=summary.median,
            ci_low=summary.ci_low,
            ci_high=summary.ci_high,
            cv=summary.cv,
            **common,
        )
    judged = contention.pooled([load for load in measurement.host_load if load.side == "candidate"])
    if judged is not None and judged.contended:
        stated += "; the rounds ran while other work took the host " + (
            "(paired rounds share it)"
            if gate.kind is GateKind.AB
            else "(a speed it could only have slowed: the verdict stands)"
            if gate.metric in contention.SPEED_METRICS
            else "(not a speed: judged as measured)"
        )
    return GateResult(
        verdict=verdict,
        reason=f"{stated}; rule {gate.describe()} -> {verdict.value}",
        method=f"{measurement.method}; {summary.method}",
        median=summary.median,
        ci_low=summary.ci_low,
        ci_high=summary.ci_high,
        cv=summary.cv,
        **common,
    )


def _exact(values: list[float], gate: GateSpec) -> Summary | None:
    """An exact metric's value as observed (the readings were checked to agree), or None."""
    if gate.metric not in EXACT_METRICS or gate.kind is GateKind.AB:
        return None
    value = values[0]
    return Summary(len(values), value, value, value, 0.0, EXACT_METRICS[gate.metric])


def _proportion(values: list[float], gate: GateSpec) -> Summary | None:
    """k/n with its Clopper-Pearson interval, for pass/miss metrics; None for anything else.

    A threshold of 1.0 ("every probe identical") is a claim about these probes, not a rate: it passes on n/n
    and fails on any miss.
    """
    if (
        gate.metric not in PROPORTION_METRICS
        or gate.kind is GateKind.AB
        or any(v not in (0.0, 1.0) for v in values)
    ):
        return None
    k, n = int(sum(values)), len(values)
    if gate.threshold >= 1.0:
        return Summary(n, k / n, k / n, k / n, 0.0, f"all {n} probes must pass: {k}/{n}")
    low, high = clopper_pearson(k, n, gate.confidence)
    return Summary(n, k / n, low, high, 0.0, f"{k}/{n}, Clopper-Pearson {gate.confidence:.0%}")


def _stated_error(values: list[float], measurement: GateMeasurement, gate: GateSpec) -> Summary | None:
    """One estimate with the error its tool reported: a normal (or t) interval of that error."""
    if measurement.standard_error is None:
        return None
    value = values[0]
    low, high = interval_from_error(
        value, measurement.standard_error, gate.confidence, dof=measurement.error_dof
    )
    shape = "normal" if measurement.error_dof is None else f"t, {measurement.error_dof} dof"
    # One estimate has no spread of its own (CV 0); its uncertainty is the stated error.
    return Summary(
        1, value, low, high, 0.0,
        f"interval of the estimate's own standard error {measurement.standard_error:.4g} ({shape})",
    )  # fmt: skip


def _judge(comparator: str, threshold: float, low: float, high: float) -> Verdict:
    if comparator == ">=":
        if low >= threshold:
            return Verdict.PASS
        return Verdict.FAIL if high < threshold else Verdict.INCONCLUSIVE
    if high <= threshold:
        return Verdict.PASS
    return Verdict.FAIL if low > threshold else Verdict.INCONCLUSIVE


def rederive(result: GateResult) -> GateResult:
    """The verdict recomputed from what a stored result holds: its gate and its measurement, nothing rerun."""
    if result.gate_spec is None or result.measurement is None:
        raise ValueError(
            f"verdict of gate {result.gate!r} keeps no gate spec and measurement (recorded before verdicts kept "
            "them, or the gate step itself failed); it cannot be re-derived"
        )
    again = judge(result.gate_spec, result.measurement, host=result.host, commit=result.commit)
    return again.model_copy(update={"evidence": result.evidence})
