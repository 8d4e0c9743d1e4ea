"""Gate metrics, measured: each metric a ticket gate may name maps to one benchmark, capacity run or probe.

`python -m daedalus.engines.measure <metric> --preset P --model M [--baseline-preset B]` prints one
`GateMeasurement` JSON on stdout, so a ticket gate's `command` can call it and `gates.verdicts.decide` judges it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated

import structlog
import typer

from daedalus.engines import startup_clock
from daedalus.engines.bench import (
    PREEMPTED_REASON,
    Launch,
    ProgressFn,
    Side,
    benchmark,
    benchmark_alternating,
)
from daedalus.engines.capacity import capacity, kv_at, ladder
from daedalus.engines.gpu import copy_bandwidth, floor_fractions, floor_tps, model_bytes_per_token
from daedalus.engines.hf_tiny_model import HF_MODELS, ensure_hf_model
from daedalus.engines.llama_build import CPU, BuildConfig, LlamaBuild, build_llama_cpp, cached_build
from daedalus.engines.metrics import SEGMENTS
from daedalus.engines.paths import default_llama_source
from daedalus.engines.presets import load_preset
from daedalus.engines.provenance import provenance, resolve_model
from daedalus.engines.quality import (
    SEED_PROBE_COUNT,
    greedy_streams,
    identity_probes,
    identity_result,
    judge_identity,
    needle_probe,
    perplexity_delta,
    temp0_identity,
    write_corpus,
)
from daedalus.engines.runner import launched, launched_together
from daedalus.engines.tiny_model import MODELS, ensure_model
from daedalus.engines.vllm import VllmKvCapacity, parse_kv_cache_log, parse_metrics, prefix_caching_problem
from daedalus.engines.workspace import WorkspaceResult, decode_workspace
from daedalus.errors import EngineError, UnsupportedMetric
from daedalus.gates import contention
from daedalus.gates.statistics import clopper_pearson
from daedalus.schemas.engines import (
    ABResidency,
    BenchResult,
    CapacityResult,
    ConcurrencyResult,
    LlamaCppPreset,
    VllmPreset,
    Workload,
)
from daedalus.schemas.gates import GateMeasurement, Metric, RoundLoad

# How each metric is produced; a metric missing here is one no engine measurement can give.
METRIC_METHODS: dict[Metric, str] = {
    Metric.DECODE_TPS: "benchmark: per-round median decode tok/s per user (server timings preferred)",
    Metric.PREFILL_TPS: "benchmark: per-round median prompt tok/s from server timings",
    Metric.TTFT_MS: "benchmark: per-round median time to the first streamed chunk with content",
    Metric.TPOT_MS: "benchmark: per-round median (E2E - TTFT) / (tokens - 1)",
    Metric.KV_POOL_TOKENS: "engine-reported KV pool at start-up (llama.cpp cells; vLLM's cache_config_info, "
    "cross-checked with its 'GPU/CPU KV cache size' line)",
    Metric.MAX_CONCURRENCY: "vLLM's cache_config_info kv_cache_max_concurrency, cross-checked with its start-up "
    "'Maximum concurrency for L tokens per request' (engine-reported)",
    Metric.ACCEPTANCE_LENGTH: "benchmark: per round, 1 + accepted / drafts from /metrics deltas (speculative)",
    Metric.POSITION_ACCEPTANCE: "benchmark: per round, accepted at draft position k / drafts (/metrics deltas)",
    Metric.COMPRESSION: "capacity: baseline KiB/token / candidate KiB/token (both fitted slopes)",
    Metric.KIB_PER_TOKEN: "capacity: slope of memory (host RSS; NVML device memory for CUDA presets) over "
    "several context sizes, with its fit interval",
    Metric.NEEDLE: "probe: needle in a haystack over depths x lengths (1 per trial found, 0 otherwise)",
    Metric.TEMP0_IDENTITY: "probe: temp-0 token identity vs the baseline over /v1/completions logprobs, near-tie "
    "rule, answers kept (1 per probe passing)",
    Metric.PPL_DELTA_PCT: "probe: llama-perplexity dPPL % vs the baseline preset",
    Metric.PREEMPTIONS: "benchmark: preempted or deferred requests during the measured rounds",
    Metric.CONCURRENT_USERS: "ladder, repeated per round: the largest N users served at once, no deferrals",
    Metric.FLOOR_FRACTION: "benchmark decode tok/s / (measured device copy GB/s / model bytes per token); GPU only",
    Metric.DECODE_WORKSPACE_MIB: "one user's long request per round: the server process tree's peak RSS during it "
    "minus the tree's RSS before any request (engines/workspace.py)",
    Metric.SEGMENT_MS: "benchmark: per round, mean ms per request in one segment (--segment queue, prefill, decode, "
    "inference or e2e) from vLLM's request histograms (/metrics deltas); every segment kept as evidence",
}
NEEDS_BASELINE = {Metric.COMPRESSION, Metric.TEMP0_IDENTITY, Metric.PPL_DELTA_PCT}


def check_metric(metric: Metric, *, baseline: bool = False) -> None:
    """Reject, with the reason, a gate metric no engine measurement produces."""
    if metric not in METRIC_METHODS:
        known = ", ".join(m.value for m in METRIC_METHODS)
        raise UnsupportedMetric(
            f"metric {metric.value!r} is not produced by an engine measurement; measurable: {known}. "
            + (
                "tests_passed comes from the ticket's test command, not an engine."
                if metric is Metric.TESTS_PASSED
                else ""
            )
        )
    if metric in NEEDS_BASELINE and not baseline:
        raise UnsupportedMetric(
            f"metric {metric.value!r} is measured against a baseline; pass --baseline-preset"
        )


async def ensure_build(source: Path | None = None, config: BuildConfig = CPU) -> LlamaBuild:
    source = source or default_llama_source()
    return cached_build(source, config) or await build_llama_cpp(source, config=config)


def build_config_for(*presets: LlamaCppPreset | VllmPreset | None) -> BuildConfig:
    """The build the llama.cpp presets need; a CPU and a CUDA preset cannot share one server build."""
    llama = [p for p in presets if isinstance(p, LlamaCppPreset)]
    backends = {p.backend for p in llama}
    if len(backends) > 1:
        raise EngineError(f"presets {', '.join(p.name for p in llama)} mix backends {sorted(backends)}; "
                          "an A/B comparison runs both sides on one build: give them the same backend")  # fmt: skip
    if backends != {"cuda"}:
        return CPU
    archs = next((p.cuda_architectures for p in llama if p.cuda_architectures), [])
    return BuildConfig.for_backend("cuda", archs)


def _series(
    result: ConcurrencyResult, metric: Metric, bench: BenchResult, position: int = 1, segment: str = "decode"
) -> list[float]:
    measured = [
        r for r in bench.rounds if r.preset == result.preset and r.users == result.users and not r.warmup
    ]
    if metric is Metric.SEGMENT_MS:
        return [r.segments_ms[segment] for r in measured if segment in r.segments_ms]
    if metric is Metric.ACCEPTANCE_LENGTH:
        return [r.acceptance_length for r in measured if r.acceptance_length is not None]
    if metric is Metric.POSITION_ACCEPTANCE:
        return [
            r.position_acceptance[position - 1] if position <= len(r.position_acceptance) else 0.0
            for r in measured
            if r.acceptance_length is not None
        ]
    if metric is Metric.DECODE_TPS:
        return result.decode_tps
    if metric is Metric.TTFT_MS:
        return result.ttft_ms
    if metric is Metric.TPOT_MS:
        return result.tpot_ms
    if metric is Metric.PREFILL_TPS:
        values = []
        for r in measured:
            tps = sorted(q.server_prompt_tps for q in r.requests if q.server_prompt_tps)
            if tps:
                values.append(tps[len(tps) // 2])
        return values
    raise UnsupportedMetric(f"{metric.value} is not a benchmark series")


def host_loads(bench: BenchResult) -> list[RoundLoad]:
    """The host's load during each measured round of the gated concurrency: the candidate's, then the baseline's."""
    users = bench.results[0].users if bench.results else None
    measured = [r for r in bench.rounds if not r.warmup and r.users == users and r.host_load is not None]
    loads = [r.host_load for r in measured if r.preset == bench.preset]
    if bench.baseline_preset is not None and bench.baseline_preset != bench.preset:
        loads += [r.host_load for r in measured if r.preset == bench.baseline_preset]
    return [load for load in loads if load is not None]


def _from_bench(
    metric: Metric, bench: BenchResult, artifact: Path, *, position: int = 1, segment: str = "decode"
) -> GateMeasurement:
    loads = host_loads(bench)
    evidence = {
        "artifact": str(artifact),
        "server_log": bench.server_log or "",
        "flags": "; ".join(bench.flags),
        **contention.evidence(loads),
    }
    if metric is Metric.SEGMENT_MS:
        # Where each measured round's time went, every segment, beside the one gated.
        for r in bench.rounds:
            if not r.warmup and r.segments_ms:
                split = ", ".join(f"{k} {v:.1f}" for k, v in r.segments_ms.items())
                evidence[f"{r.preset} round {r.round} ms"] = split
    invalid = "; ".join(bench.invalid_reasons) or None
    if metric is Metric.PREEMPTIONS:
        # The preemptions are what this gate measures, not what broke its measurement: FAIL, never INVALID.
        others = [r for r in bench.invalid_reasons if not r.endswith(PREEMPTED_REASON)]
        return GateMeasurement(samples=[float(bench.preemptions)], unit="requests",
                               method=f"benchmark, {bench.workload.rounds} rounds at {bench.workload.users} users: "
                                      "preempted or deferred requests over the measured rounds (/metrics deltas)",
                               evidence=evidence, invalid_reason="; ".join(others) or None,
                               failed_requests=bench.failed_requests, host_load=loads)  # fmt: skip
    samples = _series(bench.results[0], metric, bench, position, segment)
    baseline = (
        _series(bench.baseline_results[0], metric, bench, position, segment)
        if bench.baseline_results
        else None
    )
    if not samples:
        invalid = invalid or (
            "no measured round drafted a token (does the preset speculate?)"
            if metric in (Metric.ACCEPTANCE_LENGTH, Metric.POSITION_ACCEPTANCE)
            else "no measured round produced a value"
        )
        samples, baseline = [0.0], ([0.0] if baseline is not None else None)
    if baseline is not None and len(baseline) != len(samples):
        invalid = invalid or "the A/B sides produced different numbers of valid rounds"
        n = min(len(baseline), len(samples)) or 1
        samples, baseline = (samples[:n] or [0.0]), (baseline[:n] or [0.0])
    unit = {"decode_tps": "tok/s", "prefill_tps": "tok/s", "ttft_ms": "ms", "tpot_ms": "ms",
            "acceptance_length": "tokens/step", "position_acceptance": f"share accepted at position {position}",
            "segment_ms": f"ms per request in {segment}"}[metric.value]  # fmt: skip
    source = ("/metrics deltas per round"
              if metric in (Metric.ACCEPTANCE_LENGTH, Metric.POSITION_ACCEPTANCE, Metric.SEGMENT_MS)
              else f"{bench.results[0].timing_source} timings")  # fmt: skip
    return GateMeasurement(
        samples=samples, baseline_samples=baseline, unit=unit,
        method=f"benchmark {source}, {bench.workload.rounds} rounds, drop warm-up, {bench.residency} residency",
        failed_requests=bench.failed_requests, preemptions=bench.preemptions,
        token_count_mismatches=bench.token_count_mismatches, invalid_reason=invalid, evidence=evidence,
        host_load=loads,
    )  # fmt: skip


def capacity_measurement(metric: Metric, cap: CapacityResult, artifact: Path) -> GateMeasurement:
    """A capacity figure as a gate measurement: a fitted slope carries its standard error, the KV pool is an
    engine-reported count (deterministic), and an unmeasurable value is INVALID, never 0."""
    evidence = {"artifact": str(artifact), "contexts": ",".join(map(str, cap.contexts)),
                "reported_kib_per_token": str(cap.kib_per_token_reported)}  # fmt: skip
    value: float | None
    if metric is Metric.KV_POOL_TOKENS:
        value = float(cap.pool_tokens) if cap.pool_tokens is not None else None
        invalid = None if value is not None else f"no KV cache line in the server log; see {artifact}"
        return GateMeasurement(samples=[value or 0.0], unit="tokens", method="engine-reported KV cells at start-up",
                               invalid_reason=invalid, evidence=evidence)  # fmt: skip
    value, se = (
        (cap.kib_per_token, cap.kib_per_token_se)
        if metric is Metric.KIB_PER_TOKEN
        else (cap.compression, cap.compression_se)
    )
    if value is None or se is None or cap.fit_dof is None:
        return GateMeasurement(samples=[0.0], unit="", invalid_reason=f"{metric.value} could not be measured "
                               f"(no positive memory slope); see {artifact}", evidence=evidence)  # fmt: skip
    unit = "KiB/token" if metric is Metric.KIB_PER_TOKEN else "x"
    return GateMeasurement(
        samples=[value], unit=unit, standard_error=se, error_dof=cap.fit_dof, evidence=evidence,
        method=f"capacity: least-squares slope of memory ({cap.kib_source}) over {len(cap.contexts)} context sizes"
        + ("" if metric is Metric.KIB_PER_TOKEN else "; baseline slope / candidate slope, delta-method error"),
    )  # fmt: skip


BENCH_METRICS = frozenset({
    Metric.DECODE_TPS, Metric.PREFILL_TPS, Metric.TTFT_MS, Metric.TPOT_MS, Metric.PREEMPTIONS,
    Metric.ACCEPTANCE_LENGTH, Metric.POSITION_ACCEPTANCE, Metric.SEGMENT_MS,
})  # fmt: skip
LLAMA_ONLY = {
    Metric.KIB_PER_TOKEN: "KiB/token is a slope of host RSS over context sizes; on vLLM read kv_pool_tokens",
    Metric.COMPRESSION: "compression compares two KiB/token slopes; on vLLM compare kv_pool_tokens of two presets",
    Metric.CONCURRENT_USERS: "the ladder sets llama.cpp slots; on vLLM gate max_concurrency or preemptions",
    Metric.PPL_DELTA_PCT: "dPPL runs llama-perplexity on GGUF weights",
}


def default_workdir(metric: Metric) -> Path:
    """Under the artifact directory (DAEDALUS_ARTIFACTS, or .daedalus/artifacts), never /tmp: a verdict points
    at its raw data, and that data must outlive the measuring process."""
    from daedalus.config import Settings

    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return Settings().artifact_dir / "measurements" / f"{stamp}-{metric.value}-{uuid.uuid4().hex[:8]}"


def residency(preset: LlamaCppPreset | VllmPreset, baseline: LlamaCppPreset | VllmPreset) -> ABResidency:
    """Both servers up at once only when both presets say they fit together; otherwise alternate."""
    both = preset.residency is ABResidency.CONCURRENT and baseline.residency is ABResidency.CONCURRENT
    return ABResidency.CONCURRENT if both else ABResidency.ALTERNATE


async def measure(
    metric: Metric,
    preset_ref: str,
    model_ref: str | Path,
    *,
    baseline_ref: str | None = None,
    workload: Workload | None = None,
    workdir: Path | None = None,
    position: int = 1,
    probes: int = SEED_PROBE_COUNT,
    segment: str = "decode",
) -> GateMeasurement:
    """Run whatever produces `metric` and return it as a gate measurement, with its provenance."""
    check_metric(metric, baseline=baseline_ref is not None)
    preset = load_preset(preset_ref)
    baseline = load_preset(baseline_ref) if baseline_ref else None
    presets = [p for p in (preset, baseline) if p is not None]
    if metric in LLAMA_ONLY and any(isinstance(p, VllmPreset) for p in presets):
        raise UnsupportedMetric(f"{metric.value} is measured on llama.cpp presets: {LLAMA_ONLY[metric]}")
    if metric is Metric.SEGMENT_MS and not isinstance(preset, VllmPreset):
        raise UnsupportedMetric("segment_ms reads vLLM's request histograms; on llama.cpp gate its own timings "
                                "(prefill_tps, decode_tps, ttft_ms)")  # fmt: skip
    if metric is Metric.SEGMENT_MS and segment not in SEGMENTS:
        raise UnsupportedMetric(f"--segment {segment!r} is not one of vLLM's: {', '.join(SEGMENTS)}")
    if metric is Metric.MAX_CONCURRENCY and not isinstance(preset, VllmPreset):
        raise UnsupportedMetric("max_concurrency is vLLM's start-up report; llama.cpp prints no such figure")
    if metric is Metric.FLOOR_FRACTION and not (
        isinstance(preset, LlamaCppPreset) and preset.backend == "cuda"
    ):
        raise UnsupportedMetric(f"floor_fraction is a GPU metric: preset {preset.name} does not run on CUDA "
                                "(set backend: cuda and n_gpu_layers, as examples/presets/gpu-*.yaml do)")  # fmt: skip
    model = resolve_model(str(model_ref), presets)
    workdir = (workdir or default_workdir(metric)).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    needs_llama = any(isinstance(p, LlamaCppPreset) for p in presets)
    build = await ensure_build(config=build_config_for(preset, baseline)) if needs_llama else None
    workload = workload or Workload()
    made = provenance(preset_ref, preset, model, build=build, artifacts=workdir, baseline=baseline,
                      workload=workload if metric in BENCH_METRICS else None,
                      extra={"position": str(position)} if metric is Metric.POSITION_ACCEPTANCE
                      else {"segment": segment} if metric is Metric.SEGMENT_MS else None)  # fmt: skip
    (workdir / "provenance.json").write_text(made.model_dump_json(indent=2))
    measured = await _measure(
        metric, preset, baseline, model, workdir, build, workload, position, probes, segment
    )
    measured = measured.model_copy(update={"provenance": made})
    (workdir / "measurement.json").write_text(measured.model_dump_json(indent=2))
    return measured


async def bench_presets(
    preset: LlamaCppPreset | VllmPreset,
    baseline: LlamaCppPreset | VllmPreset | None,
    model: Path,
    workdir: Path,
    *,
    build: LlamaBuild | None,
    workload: Workload,
    run_id: str,
    on_progress: ProgressFn | None = None,
    show_progress: bool | None = None,
) -> BenchResult:
    """Benchmark a preset, or an A/B of two: both resident when the presets say they fit, else alternating.
    A server running with prefix caching its preset did not ask for makes the run INVALID."""
    if baseline is not None and residency(preset, baseline) is ABResidency.ALTERNATE:
        return await benchmark_alternating((preset.name, _launch(preset, model, workdir, build)),
                                           (baseline.name, _launch(baseline, model, workdir, build)),
                                           workload, run_id=run_id, model=str(model), on_progress=on_progress)  # fmt: skip
    if baseline is None:
        async with launched(preset, model, workdir / "candidate", build=build) as server:
            problem = await prefix_caching_problem(server)
            bench = await benchmark(Side(name=preset.name, server=server), workload, run_id=run_id,
                                    model=str(model), on_progress=on_progress, show_progress=show_progress)  # fmt: skip
    else:
        # Both resident: started together, so their start-ups overlap.
        async with launched_together((preset, model, workdir / "candidate"),
                                     (baseline, model, workdir / "baseline"), build=build) as (server, base_server):  # fmt: skip
            problem = await prefix_caching_problem(server) or await prefix_caching_problem(base_server)
            bench = await benchmark(Side(name=preset.name, server=server), workload, run_id=run_id,
                                    model=str(model), on_progress=on_progress, show_progress=show_progress,
                                    baseline=Side(name=baseline.name, server=base_server))  # fmt: skip
    if problem:
        bench = bench.model_copy(update={"invalid_reasons": [*bench.invalid_reasons, problem]})
    return bench


def _launch(
    preset: LlamaCppPreset | VllmPreset, model: Path, workdir: Path, build: LlamaBuild | None
) -> Launch:
    starts = iter(range(1_000_000))
    return lambda: launched(preset, model, workdir / f"{preset.name}-start{next(starts)}", build=build)


async def _measure(
    metric: Metric,
    preset: LlamaCppPreset | VllmPreset,
    baseline: LlamaCppPreset | VllmPreset | None,
    model: Path,
    workdir: Path,
    build: LlamaBuild | None,
    workload: Workload,
    position: int,
    probes: int,
    segment: str = "decode",
) -> GateMeasurement:
    if metric is Metric.FLOOR_FRACTION:
        return await _floor_fraction(preset, model, workload, workdir, build)
    if metric in BENCH_METRICS:
        bench = await bench_presets(preset, baseline, model, workdir, build=build, workload=workload,
                                    run_id=workdir.name)  # fmt: skip
        artifact = workdir / "bench.json"
        artifact.write_text(bench.model_dump_json(indent=2))
        return _from_bench(metric, bench, artifact, position=position, segment=segment)

    if metric is Metric.DECODE_WORKSPACE_MIB:
        async with launched(preset, model, workdir / "workspace", build=build) as server:
            used = await decode_workspace(server, workload.model_copy(update={"users": [1]}))
            log_text, metrics_text = server.log_text(), await asyncio.to_thread(server.metrics_text)
        return workspace_measurement(used, preset, log_text, metrics_text, workdir)

    if metric in (Metric.KV_POOL_TOKENS, Metric.MAX_CONCURRENCY) and isinstance(preset, VllmPreset):
        async with launched(preset, model, workdir / "capacity", build=build) as server:
            log_text = server.log_text()
            metrics_text = await asyncio.to_thread(server.metrics_text)
        return vllm_capacity_measurement(metric, log_text, metrics_text, server.log_path)

    if metric is Metric.NEEDLE:
        async with launched(preset, model, workdir / "needle", build=build) as server:
            needle = await needle_probe(server)
        artifact = workdir / "needle.json"
        artifact.write_text(needle.model_dump_json(indent=2))
        low, high = clopper_pearson(needle.found, needle.total)
        return GateMeasurement(samples=[1.0 if t.found else 0.0 for t in needle.trials], unit="found",
                               method="needle string match",
                               evidence={"k/n": f"{needle.found}/{needle.total}", "artifact": str(artifact),
                                         "clopper_pearson_90": f"[{low:.3f}, {high:.3f}]"})  # fmt: skip

    if metric is Metric.TEMP0_IDENTITY:
        assert baseline is not None
        probe_set = identity_probes(probes)
        if residency(preset, baseline) is ABResidency.ALTERNATE:
            # Identity needs no pairing in time: all candidate streams first, then all baseline streams.
            async with launched(preset, model, workdir / "candidate", build=build) as cand_server:
                cand_streams = await greedy_streams(cand_server, probe_set)
            async with launched(baseline, model, workdir / "baseline", build=build) as base_server:
                base_streams = await greedy_streams(base_server, probe_set)
            judgements = [
                judge_identity(p, c, b) for p, c, b in zip(probe_set, cand_streams, base_streams, strict=True)
            ]
            t0 = identity_result(preset.name, baseline.name, judgements)
        else:
            async with launched_together((preset, model, workdir / "candidate"),
                                         (baseline, model, workdir / "baseline"), build=build) as servers:  # fmt: skip
                t0 = await temp0_identity(servers[0], servers[1], probes=probe_set)
        artifact = workdir / "temp0_identity.json"
        artifact.write_text(t0.model_dump_json(indent=2))
        return GateMeasurement(samples=[1.0 if j.passed else 0.0 for j in t0.judgements], unit="probes passing",
                               method=f"temp-0 identity over {t0.prompts} probes, near-tie gap < 0.25, answers kept",
                               evidence={"detail": t0.detail, "artifact": str(artifact)})  # fmt: skip

    # What is left runs llama.cpp's own tools on GGUF weights.
    assert build is not None and isinstance(preset, LlamaCppPreset)
    if metric in (Metric.KIB_PER_TOKEN, Metric.COMPRESSION, Metric.KV_POOL_TOKENS):
        if metric is Metric.KV_POOL_TOKENS:
            at_preset = await kv_at(preset, model, workdir, build)
            cap = CapacityResult(preset=preset.name, measurements=[at_preset], kib_per_token=0.0,
                                 pool_tokens=at_preset.pool_tokens)  # fmt: skip
        else:
            assert baseline is None or isinstance(baseline, LlamaCppPreset)
            cap = await capacity(preset, model, workdir, build, baseline=baseline)
        artifact = workdir / "capacity.json"
        artifact.write_text(cap.model_dump_json(indent=2))
        return capacity_measurement(metric, cap, artifact)
    if metric is Metric.CONCURRENT_USERS:
        # Each repetition of the ladder is one sample: the largest N served at once with no deferral.
        samples: list[float] = []
        evidence: dict[str, str] = {}
        for rep in range(workload.rounds):
            steps = await ladder(preset, model, workdir / f"ladder-rep{rep}", build,
                                 users=tuple(workload.users) if workload.users != [1] else (1, 2, 4))  # fmt: skip
            passed = [s.users for s in steps if s.passed]
            samples.append(float(max(passed) if passed else 0))
            evidence |= {f"rep{rep} users={s.users}": "pass" if s.passed else s.detail for s in steps}
        return GateMeasurement(samples=samples, unit="users", method=f"ladder, {workload.rounds} repetitions",
                               evidence=evidence)  # fmt: skip
    if metric is Metric.PPL_DELTA_PCT:
        assert isinstance(baseline, LlamaCppPreset)
        corpus = write_corpus(workdir / "corpus.txt")
        ppl = await perplexity_delta(build, preset, baseline, model, corpus, workdir)
        return GateMeasurement(samples=[ppl.delta_pct or 0.0], unit="%",
                               method="llama-perplexity dPPL; error: both runs' +/- in quadrature",
                               standard_error=ppl.delta_err_pct,
                               evidence={"ppl": f"{ppl.ppl} +/- {ppl.ppl_err}",
                                         "baseline_ppl": f"{ppl.baseline_ppl} +/- {ppl.baseline_ppl_err}",
                                         "delta_err_pct": f"{ppl.delta_err_pct}"})  # fmt: skip
    raise UnsupportedMetric(f"metric {metric.value!r} has no measurement")


def workspace_measurement(
    used: WorkspaceResult,
    preset: LlamaCppPreset | VllmPreset,
    log_text: str,
    metrics_text: str,
    workdir: Path,
) -> GateMeasurement:
    """The decode workspace per round, with the pool and the prompt beside it; a refused prompt is INVALID."""
    artifact = workdir / "workspace.json"
    artifact.write_text(used.model_dump_json(indent=2))
    evidence = {"artifact": str(artifact), "idle_mib": f"{used.idle_mib:.1f}",
                "prompt_tokens": ", ".join(map(str, used.prompt_tokens)),
                "peaks_mib": ", ".join(f"{p:.1f}" for p in used.peaks_mib)}  # fmt: skip
    if isinstance(preset, VllmPreset):
        evidence["max_model_len"] = str(preset.max_model_len)
        try:
            evidence["log_pool_tokens"] = str(parse_kv_cache_log(log_text).pool_tokens)
        except EngineError:
            evidence["log_pool_tokens"] = "None"
        if metrics_text:
            evidence["metrics_pool_tokens"] = str(parse_metrics(metrics_text).pool_tokens)
    invalid = (
        f"the server refused the prompt: {used.refused}"
        if used.refused
        else None
        if used.samples_mib
        else "no measured round"
    )
    return GateMeasurement(samples=used.samples_mib or [0.0], unit="MiB", invalid_reason=invalid, evidence=evidence,
                           method="peak RSS of the server's process tree during one user's request (sampled every "
                                  "20 ms) minus its RSS before any request, per round after the warm-up")  # fmt: skip


def vllm_capacity_measurement(
    metric: Metric, log_text: str, metrics_text: str, log_path: Path
) -> GateMeasurement:
    """kv_pool_tokens or max_concurrency from the running server's /metrics (`vllm:cache_config_info`'s
    kv_cache_size_tokens and kv_cache_max_concurrency, or blocks x block size on builds without them), else from
    its start-up log ('GPU/CPU KV cache size', 'Maximum concurrency for'); the other source is the cross-check.

    Both are the engine's own report of what it allocated: deterministic, and the verdict says so."""
    reported = parse_metrics(metrics_text)
    try:
        cap: VllmKvCapacity | None = parse_kv_cache_log(log_text)
    except EngineError:
        cap = None
    log_pool = cap.pool_tokens if cap else None
    log_concurrency = cap.max_concurrency if cap else None
    evidence = {"server_log": str(log_path), "log_pool_tokens": str(log_pool),
                "metrics_pool_tokens": str(reported.pool_tokens),
                "metrics_max_concurrency": str(reported.kv_cache_max_concurrency),
                "log_max_concurrency": f"{log_concurrency} at {cap.concurrency_len if cap else None} tokens per "
                                       "request"}  # fmt: skip
    value: float | None
    other: float | None
    if metric is Metric.KV_POOL_TOKENS:
        value = reported.pool_tokens if reported.pool_tokens is not None else log_pool
        source = "vllm:cache_config_info" if reported.pool_tokens is not None else "start-up log"
        other = log_pool if reported.pool_tokens is not None else None
    else:
        value = reported.kv_cache_max_concurrency
        source = "vllm:cache_config_info"
        if value is None:
            value, source = log_concurrency, "start-up log"
        other = log_concurrency if source == "vllm:cache_config_info" else None
    invalid = (
        None
        if value is not None
        else f"neither /metrics nor the start-up log reports {metric.value}; see {log_path}"
    )
    # Two reports of one allocation: a disagreement beyond one block (pool) or 1% (concurrency) is shown beside
    # the verdict (hybrid models size their groups differently, so it is evidence to read, not a broken run).
    tolerance = (reported.block_size or 0) if metric is Metric.KV_POOL_TOKENS else abs(value or 0.0) * 0.01
    if value is not None and other is not None and abs(value - other) > tolerance:
        evidence["disagreement"] = f"{source} says {value}, the start-up log {other}"
    unit = "tokens" if metric is Metric.KV_POOL_TOKENS else "x"
    return GateMeasurement(samples=[float(value or 0.0)], unit=unit, invalid_reason=invalid, evidence=evidence,
                           method=f"vLLM's {source} (engine-reported), cross-checked with the other report")  # fmt: skip


async def _floor_fraction(
    preset: LlamaCppPreset | VllmPreset,
    model: Path,
    workload: Workload,
    workdir: Path,
    build: LlamaBuild | None,
) -> GateMeasurement:
    """Decode rounds as fractions of the bandwidth floor; the copy benchmark runs before the server starts."""
    bandwidth = await asyncio.to_thread(copy_bandwidth)
    per_token = model_bytes_per_token(model)
    async with launched(preset, model, workdir / "candidate", build=build) as server:
        bench = await benchmark(Side(name=preset.name, server=server), workload, run_id=workdir.name,
                                model=str(model))  # fmt: skip
    artifact = workdir / "bench.json"
    artifact.write_text(bench.model_dump_json(indent=2))
    decode = _from_bench(Metric.DECODE_TPS, bench, artifact)
    floor = floor_tps(bandwidth.gbs, per_token)
    return decode.model_copy(update={
        "samples": floor_fractions(decode.samples, bandwidth.gbs, per_token), "unit": "of the bandwidth floor",
        "method": f"decode tok/s / floor; floor = copy {bandwidth.gbs:.0f} GB/s (read+written, {bandwidth.device}) "
                  f"/ {per_token / 1e9:.3f} GB per token = {floor:.0f} tok/s",
        "evidence": {**decode.evidence, "copy_bandwidth_gbs": f"{bandwidth.gbs:.1f}",
                     "copy_rounds_gbs": ", ".join(f"{g:.0f}" for g in bandwidth.rounds_gbs),
                     "model_bytes_per_token": str(per_token), "floor_tps": f"{floor:.1f}",
                     "decode_tps": ", ".join(f"{t:.1f}" for t in decode.samples)},
    })  # fmt: skip


app = typer.Typer(add_completion=False, help="Measure one gate metric and print a GateMeasurement JSON.")


@app.command()
def main(
    metric: Annotated[Metric, typer.Argument(help="the gate metric")],
    preset: Annotated[str, typer.Option(help="preset name (examples/presets) or YAML path")],
    model: Annotated[
        str,
        typer.Option(
            help="a GGUF file, a tiny model name (tiny, small, medium), or for vLLM a Hugging Face model "
            "directory or id, or tiny-llama (a random-weight Llama written with the vLLM environment)"
        ),
    ],
    baseline_preset: Annotated[
        str | None, typer.Option(help="baseline preset for A/B and relative metrics")
    ] = None,
    users: Annotated[int, typer.Option(min=1)] = 1,
    rounds: Annotated[int, typer.Option(min=1)] = 7,
    max_tokens: Annotated[int, typer.Option(min=2)] = 64,
    prompt_words: Annotated[int, typer.Option(min=1)] = 32,
    position: Annotated[
        int, typer.Option(min=1, help="position_acceptance: the draft position, 1-based")
    ] = 1,
    probes: Annotated[
        int, typer.Option(min=1, help="temp0_identity: probe prompts (the seed's 6d: 60)")
    ] = 60,
    segment: Annotated[
        str,
        typer.Option(help="segment_ms: queue, prefill, decode, inference or e2e (vLLM's request histograms)"),
    ] = "decode",
    workdir: Annotated[
        Path | None, typer.Option(help="artifacts; default under the artifact directory")
    ] = None,
) -> None:
    # stdout carries exactly one JSON object; logs go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    # Run as a gate, its engines' start-ups are timed apart from its measuring (engines/startup_clock.py).
    clock = os.environ.get(startup_clock.STARTUP_CLOCK_ENV)
    startup_clock.configure(Path(clock) if clock else None)
    workload = Workload(users=[users], rounds=rounds, max_tokens=max_tokens, prompt_words=prompt_words)
    try:
        model_ref = (
            str(ensure_model(model))
            if model in MODELS
            else str(ensure_hf_model(model))
            if model in HF_MODELS
            else model
        )
        result = asyncio.run(measure(metric, preset, model_ref, baseline_ref=baseline_preset, workload=workload,
                                     workdir=workdir, position=position, probes=probes, segment=segment))  # fmt: skip
    except EngineError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    sys.stdout.write(json.dumps(result.model_dump(mode="json")) + "\n")


if __name__ == "__main__":
    from daedalus.config import Settings
    from daedalus.engines import paths

    paths.configure(Settings.load().engines)  # `python -m` is an entry point of its own
    app()
