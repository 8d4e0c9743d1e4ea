"""Prometheus /metrics text, parsed with prometheus_client's parser into flat name -> value maps."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def flatten(text: str) -> dict[str, float]:
    """Every sample summed over its label sets (engines and ranks), keyed by sample name.

    Info-style gauges (value 1 with labels) are kept per label in `labels()` instead.
    """
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


def labels(text: str, metric: str) -> dict[str, str]:
    """The labels of the first sample of `metric` (e.g. vllm:cache_config_info's block size)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric:
                return dict(sample.labels)
    return {}


def counter(values: dict[str, float], name: str) -> float:
    """A counter's value whether or not the exposition carried the `_total` suffix."""
    for key in (name, f"{name}_total", name.removesuffix("_total")):
        if key in values:
            return values[key]
    return 0.0
