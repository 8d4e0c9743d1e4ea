"""Gate metrics, measured: each metric a ticket gate may name has one recipe (`RECIPES`): its method, what it
needs, and the benchmark, capacity run or probe that measures it.

`daedalus engine measure <metric> --preset P --model M [--baseline-preset B]` (cli/measure.py; also
`python -m daedalus.engines.measure`) prints one `GateMeasurement` JSON on stdout, so a ticket gate's `command`
can call it and `gates.verdicts.judge` judges it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

Preset = LlamaCppPreset | VllmPreset


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


def residency(preset: LlamaCppPreset | VllmPreset, baseline: LlamaCppPreset | VllmPreset) -> ABResidency:
    """Both servers up at once only when both presets say they fit together; otherwise alternate."""
    both = preset.residency is ABResidency.CONCURRENT and baseline.residency is ABResidency.CONCURRENT
    return ABResidency.CONCURRENT if both else ABResidency.ALTERNATE


async def measure(
    metric: Metric,
    preset_ref: str,
    model_ref: str | Path,
    *,
    workdir: Path,
    baseline_ref: str | None = None,
    workload: Workload | None = None,
    position: int = 1,
    probes: int = SEED_PROBE_COUNT,
    segment: str = "decode",
) -> GateMeasurement:
    """Run whatever produces `metric` (its recipe) and return it as a gate measurement, with its provenance.
    `workdir` holds the raw data the verdict points at: under the artifact directory, never /tmp."""
    check_metric(metric, baseline=baseline_ref is not None)
    recipe = RECIPES[metric]
    preset = load_preset(preset_ref)
    baseline = load_preset(baseline_ref) if baseline_ref else None
    if recipe.refuse is not None and (problem := recipe.refuse(preset, baseline, segment)):
        raise UnsupportedMetric(problem)
    presets = [p for p in (preset, baseline) if p is not None]
    model = resolve_model(str(model_ref), presets)
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    needs_llama = any(isinstance(p, LlamaCppPreset) for p in presets)
    build = await ensure_build(config=build_config_for(preset, baseline)) if needs_llama else None
    workload = workload or Workload()
    made = provenance(preset_ref, preset, model, build=build, artifacts=workdir, baseline=baseline,
                      workload=workload if recipe.bench else None,
                      extra={"position": str(position)} if metric is Metric.POSITION_ACCEPTANCE
                      else {"segment": segment} if metric is Metric.SEGMENT_MS else None)  # fmt: skip
    (workdir / "provenance.json").write_text(made.model_dump_json(indent=2))
    assert recipe.run is not None  # check_metric refused a metric no recipe runs
    job = Job(metric, preset, baseline, model, workdir, build, workload, position, probes, segment)
    measured = (await recipe.run(job)).model_copy(update={"provenance": made})
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


@dataclass(frozen=True)
class Job:
    """What a recipe measures with: the presets as loaded, the model, the build, the workload and options."""

    metric: Metric
    preset: Preset
    baseline: Preset | None
    model: Path
    workdir: Path
    build: LlamaBuild | None
    workload: Workload
    position: int = 1
    probes: int = SEED_PROBE_COUNT
    segment: str = "decode"


async def _benchmarked(job: Job) -> GateMeasurement:
    bench = await bench_presets(job.preset, job.baseline, job.model, job.workdir, build=job.build,
                                workload=job.workload, run_id=job.workdir.name)  # fmt: skip
    artifact = job.workdir / "bench.json"
    artifact.write_text(bench.model_dump_json(indent=2))
    return _from_bench(job.metric, bench, artifact, position=job.position, segment=job.segment)


async def _workspace(job: Job) -> GateMeasurement:
    async with launched(job.preset, job.model, job.workdir / "workspace", build=job.build) as server:
        used = await decode_workspace(server, job.workload.model_copy(update={"users": [1]}))
        log_text, metrics_text = server.log_text(), await asyncio.to_thread(server.metrics_text)
    return workspace_measurement(used, job.preset, log_text, metrics_text, job.workdir)


async def _vllm_capacity(job: Job) -> GateMeasurement:
    async with launched(job.preset, job.model, job.workdir / "capacity", build=job.build) as server:
        log_text = server.log_text()
        metrics_text = await asyncio.to_thread(server.metrics_text)
    return vllm_capacity_measurement(job.metric, log_text, metrics_text, server.log_path)


async def _kv_pool(job: Job) -> GateMeasurement:
    """vLLM's reported pool, or llama.cpp's KV cells at start-up."""
    if isinstance(job.preset, VllmPreset):
        return await _vllm_capacity(job)
    assert job.build is not None
    at_preset = await kv_at(job.preset, job.model, job.workdir, job.build)
    cap = CapacityResult(preset=job.preset.name, measurements=[at_preset], kib_per_token=0.0,
                         pool_tokens=at_preset.pool_tokens)  # fmt: skip
    return _capacity_artifact(job, cap)


async def _capacity(job: Job) -> GateMeasurement:
    assert job.build is not None and isinstance(job.preset, LlamaCppPreset)
    assert job.baseline is None or isinstance(job.baseline, LlamaCppPreset)
    cap = await capacity(job.preset, job.model, job.workdir, job.build, baseline=job.baseline)
    return _capacity_artifact(job, cap)


def _capacity_artifact(job: Job, cap: CapacityResult) -> GateMeasurement:
    artifact = job.workdir / "capacity.json"
    artifact.write_text(cap.model_dump_json(indent=2))
    return capacity_measurement(job.metric, cap, artifact)


async def _needle(job: Job) -> GateMeasurement:
    async with launched(job.preset, job.model, job.workdir / "needle", build=job.build) as server:
        needle = await needle_probe(server)
    artifact = job.workdir / "needle.json"
    artifact.write_text(needle.model_dump_json(indent=2))
    low, high = clopper_pearson(needle.found, needle.total)
    return GateMeasurement(samples=[1.0 if t.found else 0.0 for t in needle.trials], unit="found",
                           method="needle string match",
                           evidence={"k/n": f"{needle.found}/{needle.total}", "artifact": str(artifact),
                                     "clopper_pearson_90": f"[{low:.3f}, {high:.3f}]"})  # fmt: skip


async def _temp0_identity(job: Job) -> GateMeasurement:
    preset, baseline, model, build, workdir = job.preset, job.baseline, job.model, job.build, job.workdir
    assert baseline is not None
    probe_set = identity_probes(job.probes)
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


async def _concurrent_users(job: Job) -> GateMeasurement:
    """Each repetition of the ladder is one sample: the largest N served at once with no deferral."""
    assert job.build is not None and isinstance(job.preset, LlamaCppPreset)
    workload = job.workload
    samples: list[float] = []
    evidence: dict[str, str] = {}
    for rep in range(workload.rounds):
        steps = await ladder(job.preset, job.model, job.workdir / f"ladder-rep{rep}", job.build,
                             users=tuple(workload.users) if workload.users != [1] else (1, 2, 4))  # fmt: skip
        passed = [s.users for s in steps if s.passed]
        samples.append(float(max(passed) if passed else 0))
        evidence |= {f"rep{rep} users={s.users}": "pass" if s.passed else s.detail for s in steps}
    return GateMeasurement(samples=samples, unit="users", method=f"ladder, {workload.rounds} repetitions",
                           evidence=evidence)  # fmt: skip


async def _ppl_delta(job: Job) -> GateMeasurement:
    assert job.build is not None and isinstance(job.preset, LlamaCppPreset)
    assert isinstance(job.baseline, LlamaCppPreset)
    corpus = write_corpus(job.workdir / "corpus.txt")
    ppl = await perplexity_delta(job.build, job.preset, job.baseline, job.model, corpus, job.workdir)
    return GateMeasurement(samples=[ppl.delta_pct or 0.0], unit="%",
                           method="llama-perplexity dPPL; error: both runs' +/- in quadrature",
                           standard_error=ppl.delta_err_pct,
                           evidence={"ppl": f"{ppl.ppl} +/- {ppl.ppl_err}",
                                     "baseline_ppl": f"{ppl.baseline_ppl} +/- {ppl.baseline_ppl_err}",
                                     "delta_err_pct": f"{ppl.delta_err_pct}"})  # fmt: skip


async def _floor(job: Job) -> GateMeasurement:
    return await _floor_fraction(job.preset, job.model, job.workload, job.workdir, job.build)


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


Refusal = Callable[[Preset, Preset | None, str], "str | None"]
"""Why a recipe cannot measure on these presets (and segment), or None: checked before anything starts."""


@dataclass(frozen=True)
class Recipe:
    """How one metric is measured: the method a verdict states, what it needs, and the coroutine that runs it.
    A metric without `run` is one no engine measurement produces (`not_measured` says where it comes from)."""

    method: str
    run: Callable[[Job], Awaitable[GateMeasurement]] | None
    needs_baseline: bool = False
    bench: bool = False
    """A benchmark series: its workload is part of the measurement's provenance."""
    refuse: Refusal | None = None
    not_measured: str = ""


def _llama_only(metric: Metric, why: str) -> Refusal:
    def refuse(preset: Preset, baseline: Preset | None, segment: str) -> str | None:
        if any(isinstance(p, VllmPreset) for p in (preset, baseline)):
            return f"{metric.value} is measured on llama.cpp presets: {why}"
        return None

    return refuse


def _segment_refusal(preset: Preset, baseline: Preset | None, segment: str) -> str | None:
    if not isinstance(preset, VllmPreset):
        return ("segment_ms reads vLLM's request histograms; on llama.cpp gate its own timings (prefill_tps, "
                "decode_tps, ttft_ms)")  # fmt: skip
    if segment not in SEGMENTS:
        return f"--segment {segment!r} is not one of vLLM's: {', '.join(SEGMENTS)}"
    return None


def _vllm_only(preset: Preset, baseline: Preset | None, segment: str) -> str | None:
    if not isinstance(preset, VllmPreset):
        return "max_concurrency is vLLM's start-up report; llama.cpp prints no such figure"
    return None


def _cuda_only(preset: Preset, baseline: Preset | None, segment: str) -> str | None:
    if isinstance(preset, LlamaCppPreset) and preset.backend == "cuda":
        return None
    return (f"floor_fraction is a GPU metric: preset {preset.name} does not run on CUDA (set backend: cuda and "
            "n_gpu_layers, as the shipped gpu-*.yaml presets do)")  # fmt: skip


def _bench(method: str, **extra: Any) -> Recipe:
    return Recipe(method=f"benchmark: {method}", run=_benchmarked, bench=True, **extra)


RECIPES: dict[Metric, Recipe] = {
    Metric.DECODE_TPS: _bench("per-round median decode tok/s per user (server timings preferred)"),
    Metric.PREFILL_TPS: _bench("per-round median prompt tok/s from server timings"),
    Metric.TTFT_MS: _bench("per-round median time to the first streamed chunk with content"),
    Metric.TPOT_MS: _bench("per-round median (E2E - TTFT) / (tokens - 1)"),
    Metric.PREEMPTIONS: _bench("preempted or deferred requests during the measured rounds"),
    Metric.ACCEPTANCE_LENGTH: _bench("per round, 1 + accepted / drafts from /metrics deltas (speculative)"),
    Metric.POSITION_ACCEPTANCE: _bench("per round, accepted at draft position k / drafts (/metrics deltas)"),
    Metric.SEGMENT_MS: _bench(
        "per round, mean ms per request in one segment (--segment queue, prefill, decode, inference or e2e) from "
        "vLLM's request histograms (/metrics deltas); every segment kept as evidence",
        refuse=_segment_refusal,
    ),
    Metric.KV_POOL_TOKENS: Recipe(
        "engine-reported KV pool at start-up (llama.cpp cells; vLLM's cache_config_info, cross-checked with its "
        "'GPU/CPU KV cache size' line)",
        run=_kv_pool,
    ),
    Metric.MAX_CONCURRENCY: Recipe(
        "vLLM's cache_config_info kv_cache_max_concurrency, cross-checked with its start-up 'Maximum concurrency "
        "for L tokens per request' (engine-reported)",
        run=_vllm_capacity,
        refuse=_vllm_only,
    ),
    Metric.COMPRESSION: Recipe(
        "capacity: baseline KiB/token / candidate KiB/token (both fitted slopes)",
        run=_capacity,
        needs_baseline=True,
        refuse=_llama_only(
            Metric.COMPRESSION,
            "compression compares two KiB/token slopes; on vLLM compare kv_pool_tokens of two presets",
        ),
    ),
    Metric.KIB_PER_TOKEN: Recipe(
        "capacity: slope of memory (host RSS; NVML device memory for CUDA presets) over several context sizes, "
        "with its fit interval",
        run=_capacity,
        refuse=_llama_only(
            Metric.KIB_PER_TOKEN,
            "KiB/token is a slope of host RSS over context sizes; on vLLM read kv_pool_tokens",
        ),
    ),
    Metric.NEEDLE: Recipe(
        "probe: needle in a haystack over depths x lengths (1 per trial found, 0 otherwise)", run=_needle
    ),
    Metric.TEMP0_IDENTITY: Recipe(
        "probe: temp-0 token identity vs the baseline over /v1/completions logprobs, near-tie rule, answers kept "
        "(1 per probe passing)",
        run=_temp0_identity,
        needs_baseline=True,
    ),
    Metric.PPL_DELTA_PCT: Recipe(
        "probe: llama-perplexity dPPL % vs the baseline preset",
        run=_ppl_delta,
        needs_baseline=True,
        refuse=_llama_only(Metric.PPL_DELTA_PCT, "dPPL runs llama-perplexity on GGUF weights"),
    ),
    Metric.CONCURRENT_USERS: Recipe(
        "ladder, repeated per round: the largest N users served at once, no deferrals",
        run=_concurrent_users,
        refuse=_llama_only(
            Metric.CONCURRENT_USERS,
            "the ladder sets llama.cpp slots; on vLLM gate max_concurrency or preemptions",
        ),
    ),
    Metric.FLOOR_FRACTION: Recipe(
        "benchmark decode tok/s / (measured device copy GB/s / model bytes per token); GPU only",
        run=_floor,
        bench=True,
        refuse=_cuda_only,
    ),
    Metric.DECODE_WORKSPACE_MIB: Recipe(
        "one user's long request per round: the server process tree's peak RSS during it minus the tree's RSS "
        "before any request (engines/workspace.py)",
        run=_workspace,
    ),
    Metric.TESTS_PASSED: Recipe(
        "the ticket's test command",
        run=None,
        not_measured="tests_passed comes from the ticket's test command, not an engine.",
    ),
}
"""One recipe per metric: a new metric is one entry here (tests/engines/test_parsers.py holds every Metric to one)."""

METRIC_METHODS: dict[Metric, str] = {m: r.method for m, r in RECIPES.items() if r.run is not None}
"""How each metric an engine measurement produces is measured."""
BENCH_METRICS = frozenset(m for m, r in RECIPES.items() if r.bench and r.run is _benchmarked)
NEEDS_BASELINE = frozenset(m for m, r in RECIPES.items() if r.needs_baseline)


def check_metric(metric: Metric, *, baseline: bool = False) -> None:
    """Reject, with the reason, a gate metric no engine measurement produces, or one missing its baseline."""
    recipe = RECIPES[metric]
    if recipe.run is None:
        known = ", ".join(METRIC_METHODS)
        raise UnsupportedMetric(
            f"metric {metric.value!r} is not produced by an engine measurement; measurable: {known}. "
            + recipe.not_measured
        )
    if recipe.needs_baseline and not baseline:
        raise UnsupportedMetric(
            f"metric {metric.value!r} is measured against a baseline; pass --baseline-preset"
        )


if __name__ == "__main__":
    # `python -m daedalus.engines.measure ...`, as gate commands written before `daedalus engine measure` call it:
    # the command itself lives with the CLI (cli/measure.py); run by name, so this library does not import it.
    import runpy

    runpy.run_module("daedalus.cli.measure", run_name="__main__", alter_sys=True)
