"""Prometheus /metrics text, parsed with prometheus_client's parser into flat name -> value maps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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


def by_label(text: str, metric: str, label: str) -> dict[str, float]:
    """A metric's samples summed per value of one label (e.g. accepted tokens per draft position)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name in (metric, f"{metric}_total", metric.removesuffix("_total"))
                and label in sample.labels
            ):
                key = sample.labels[label]
                values[key] = values.get(key, 0.0) + float(sample.value)
    return values


@dataclass(frozen=True)
class SpecCounters:
    """Speculative-decoding counters, as vLLM (`vllm:`) and llama-server (`llamacpp:`) both name them."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_position: Mapping[int, float] = field(default_factory=dict)

    def since(self, before: SpecCounters) -> SpecCounters:
        """What the counters added between two readings."""
        positions = set(self.accepted_per_position) | set(before.accepted_per_position)
        return SpecCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted=self.accepted - before.accepted,
            accepted_per_position={
                k: self.accepted_per_position.get(k, 0.0) - before.accepted_per_position.get(k, 0.0)
                for k in sorted(positions)
            },
        )

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens per verification step: 1 + accepted / drafts (the seed's 2.98 for MTP3)."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    def position_acceptance(self, position: int) -> float | None:
        """The share of drafts whose token at `position` (1-based) was accepted."""
        if self.drafts <= 0:
            return None
        return self.accepted_per_position.get(position - 1, 0.0) / self.drafts


def spec_counters(text: str) -> SpecCounters:
    values = flatten(text)
    for prefix in ("vllm:", "llamacpp:"):
        if any(k.startswith(f"{prefix}spec_decode_num_drafts") for k in values):
            per_pos = by_label(text, f"{prefix}spec_decode_num_accepted_tokens_per_pos_total", "position")
            return SpecCounters(
                drafts=counter(values, f"{prefix}spec_decode_num_drafts_total"),
                draft_tokens=counter(values, f"{prefix}spec_decode_num_draft_tokens_total"),
                accepted=counter(values, f"{prefix}spec_decode_num_accepted_tokens_total"),
                accepted_per_position={int(k): v for k, v in per_pos.items()},
            )
    return SpecCounters()


SEGMENTS = {
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "inference": "vllm:request_inference_time_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
"""Where a request's time goes, as vLLM's own per-request histograms split it (queue + inference = e2e, and
inference = prefill + decode); the seed's P0 profiling split a step into segments the same way."""


def segment_totals(text: str) -> dict[str, tuple[float, float]]:
    """Each segment's histogram (sum of seconds, count of requests) so far; segments the engine lacks are absent."""
    values = flatten(text)
    return {
        name: (values[f"{metric}_sum"], values[f"{metric}_count"])
        for name, metric in SEGMENTS.items()
        if f"{metric}_count" in values and f"{metric}_sum" in values
    }


def segment_means_ms(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, float]:
    """Mean milliseconds per request in each segment between two readings (segments with no request left out)."""
    means = {}
    for name, (total, count) in after.items():
        total_before, count_before = before.get(name, (0.0, 0.0))
        if count > count_before:
            means[name] = (total - total_before) / (count - count_before) * 1000.0
    return means
