"""Gate metrics, measured: each metric a ticket gate may name maps to one benchmark, capacity run or probe.

`python -m daedalus.engines.measure <metric> --preset P --model M [--baseline-preset B]` prints one
`GateMeasurement` JSON on stdout, so a ticket gate's `command` can call it and `gates.verdicts.decide` judges it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Annotated

import structlog
import typer

from daedalus.engines.bench import Side, benchmark
from daedalus.engines.capacity import capacity, ladder
from daedalus.engines.gpu import copy_bandwidth, floor_fractions, floor_tps, model_bytes_per_token
from daedalus.engines.llama_build import CPU, BuildConfig, LlamaBuild, build_llama_cpp, cached_build
from daedalus.engines.paths import default_llama_source
from daedalus.engines.presets import load_preset
from daedalus.engines.quality import needle_probe, perplexity_delta, temp0_identity, write_corpus
from daedalus.engines.runner import launched
from daedalus.engines.tiny_model import MODELS, ensure_model
from daedalus.errors import EngineError, UnsupportedMetric
from daedalus.gates.statistics import clopper_pearson
from daedalus.schemas.engines import BenchResult, ConcurrencyResult, LlamaCppPreset, VllmPreset, Workload
from daedalus.schemas.gates import GateMeasurement, Metric

# How each metric is produced; a metric missing here is one no engine measurement can give.
METRIC_METHODS: dict[Metric, str] = {
    Metric.DECODE_TPS: "benchmark: per-round median decode tok/s per user (server timings preferred)",
    Metric.PREFILL_TPS: "benchmark: per-round median prompt tok/s from server timings",
    Metric.TTFT_MS: "benchmark: per-round median time to the first streamed chunk with content",
    Metric.TPOT_MS: "benchmark: per-round median (E2E - TTFT) / (tokens - 1)",
    Metric.KV_POOL_TOKENS: "capacity: KV cells the engine allocated at the preset's context",
    Metric.COMPRESSION: "capacity: baseline KiB/token / candidate KiB/token (both by difference)",
    Metric.KIB_PER_TOKEN: "capacity: memory at two context sizes (host RSS; NVML device memory for CUDA presets), "
    "divided by the token difference",
    Metric.NEEDLE: "probe: needle in a haystack over depths x lengths (1 per trial found, 0 otherwise)",
    Metric.TEMP0_IDENTITY: "probe: temp-0 token identity vs the baseline, near-tie rule (1 per prompt passing)",
    Metric.PPL_DELTA_PCT: "probe: llama-perplexity dPPL % vs the baseline preset",
    Metric.PREEMPTIONS: "benchmark: preempted or deferred requests during the measured rounds",
    Metric.CONCURRENT_USERS: "ladder: the largest N users served at once with zero failures and deferrals",
    Metric.FLOOR_FRACTION: "benchmark decode tok/s / (measured device copy GB/s / model bytes per token); GPU only",
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


def _series(result: ConcurrencyResult, metric: Metric, bench: BenchResult) -> list[float]:
    if metric is Metric.DECODE_TPS:
        return result.decode_tps
    if metric is Metric.TTFT_MS:
        return result.ttft_ms
    if metric is Metric.TPOT_MS:
        return result.tpot_ms
    if metric is Metric.PREFILL_TPS:
        rounds = [
            r for r in bench.rounds if r.preset == result.preset and r.users == result.users and not r.warmup
        ]
        values = []
        for r in rounds:
            tps = sorted(q.server_prompt_tps for q in r.requests if q.server_prompt_tps)
            if tps:
                values.append(tps[len(tps) // 2])
        return values
    raise UnsupportedMetric(f"{metric.value} is not a benchmark series")


def _from_bench(metric: Metric, bench: BenchResult, artifact: Path) -> GateMeasurement:
    evidence = {
        "artifact": str(artifact),
        "server_log": bench.server_log or "",
        "flags": "; ".join(bench.flags),
    }
    invalid = "; ".join(bench.invalid_reasons) or None
    if metric is Metric.PREEMPTIONS:
        return GateMeasurement(samples=[float(bench.preemptions)], unit="requests", method="benchmark",
                               evidence=evidence, invalid_reason=invalid,
                               failed_requests=bench.failed_requests)  # fmt: skip
    samples = _series(bench.results[0], metric, bench)
    baseline = _series(bench.baseline_results[0], metric, bench) if bench.baseline_results else None
    if not samples:
        invalid = invalid or "no measured round produced a value"
        samples, baseline = [0.0], ([0.0] if baseline is not None else None)
    if baseline is not None and len(baseline) != len(samples):
        invalid = invalid or "the A/B sides produced different numbers of valid rounds"
        n = min(len(baseline), len(samples)) or 1
        samples, baseline = (samples[:n] or [0.0]), (baseline[:n] or [0.0])
    unit = {"decode_tps": "tok/s", "prefill_tps": "tok/s", "ttft_ms": "ms", "tpot_ms": "ms"}[metric.value]
    return GateMeasurement(
        samples=samples, baseline_samples=baseline, unit=unit,
        method=f"benchmark {bench.results[0].timing_source} timings, {bench.workload.rounds} rounds, drop warm-up",
        failed_requests=bench.failed_requests, preemptions=bench.preemptions,
        token_count_mismatches=bench.token_count_mismatches, invalid_reason=invalid, evidence=evidence,
    )  # fmt: skip


async def measure(
    metric: Metric,
    preset_ref: str,
    model: Path,
    *,
    baseline_ref: str | None = None,
    workload: Workload | None = None,
    workdir: Path | None = None,
) -> GateMeasurement:
    """Run whatever produces `metric` and return it as a gate measurement."""
    check_metric(metric, baseline=baseline_ref is not None)
    preset = load_preset(preset_ref)
    baseline = load_preset(baseline_ref) if baseline_ref else None
    if not model.is_file():
        raise EngineError(f"model file {model} does not exist")
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"daedalus-measure-{metric.value}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if metric is Metric.FLOOR_FRACTION and not (
        isinstance(preset, LlamaCppPreset) and preset.backend == "cuda"
    ):
        raise UnsupportedMetric(f"floor_fraction is a GPU metric: preset {preset.name} does not run on CUDA "
                                "(set backend: cuda and n_gpu_layers, as examples/presets/gpu-*.yaml do)")  # fmt: skip
    needs_llama = any(isinstance(p, LlamaCppPreset) for p in (preset, baseline) if p is not None)
    build = await ensure_build(config=build_config_for(preset, baseline)) if needs_llama else None
    workload = workload or Workload()

    if metric is Metric.FLOOR_FRACTION:
        return await _floor_fraction(preset, model, workload, workdir, build)

    if metric in (Metric.DECODE_TPS, Metric.PREFILL_TPS, Metric.TTFT_MS, Metric.TPOT_MS, Metric.PREEMPTIONS):
        async with launched(preset, model, workdir / "candidate", build=build) as server:
            cand = Side(name=preset.name, server=server)
            if baseline is None:
                bench = await benchmark(cand, workload, run_id=workdir.name, model=str(model))
            else:
                async with launched(baseline, model, workdir / "baseline", build=build) as base_server:
                    bench = await benchmark(cand, workload, run_id=workdir.name, model=str(model),
                                            baseline=Side(name=baseline.name, server=base_server))  # fmt: skip
        artifact = workdir / "bench.json"
        artifact.write_text(bench.model_dump_json(indent=2))
        return _from_bench(metric, bench, artifact)

    if isinstance(preset, VllmPreset) or isinstance(baseline, VllmPreset):
        raise UnsupportedMetric(f"{metric.value} is measured on llama.cpp presets on this host; vLLM capacity comes "
                                "from its start-up log (daedalus.engines.vllm.parse_kv_cache_log)")  # fmt: skip
    assert build is not None
    if metric in (Metric.KIB_PER_TOKEN, Metric.COMPRESSION, Metric.KV_POOL_TOKENS):
        cap = await capacity(preset, model, workdir, build, baseline=baseline)  # type: ignore[arg-type]
        artifact = workdir / "capacity.json"
        artifact.write_text(cap.model_dump_json(indent=2))
        measured = {Metric.KIB_PER_TOKEN: cap.kib_per_token, Metric.COMPRESSION: cap.compression,
                    Metric.KV_POOL_TOKENS: cap.pool_tokens}[metric]  # fmt: skip
        # An unmeasurable value (no RSS difference, no KV line in the log) is a broken measurement, not a 0.
        invalid = None if measured is not None else f"{metric.value} could not be measured; see {artifact}"
        value = float(measured or 0.0)
        unit = {Metric.KIB_PER_TOKEN: "KiB/token", Metric.COMPRESSION: "x", Metric.KV_POOL_TOKENS: "tokens"}[
            metric
        ]
        return GateMeasurement(samples=[value], unit=unit, method=f"capacity by difference ({cap.kib_source})",
                               invalid_reason=invalid,
                               evidence={"artifact": str(artifact),
                                         "reported_kib_per_token": str(cap.kib_per_token_reported)})  # fmt: skip
    if metric is Metric.CONCURRENT_USERS:
        steps = await ladder(preset, model, workdir, build, users=tuple(workload.users) if workload.users != [1]
                             else (1, 2, 4))  # fmt: skip
        passed = [s.users for s in steps if s.passed]
        return GateMeasurement(samples=[float(max(passed) if passed else 0)], unit="users", method="ladder",
                               evidence={s.users.__str__(): "pass" if s.passed else s.detail for s in steps})  # fmt: skip
    if metric is Metric.NEEDLE:
        async with launched(preset, model, workdir / "needle", build=build) as server:
            needle = await needle_probe(server)
        low, high = clopper_pearson(needle.found, needle.total)
        return GateMeasurement(samples=[1.0 if t.found else 0.0 for t in needle.trials], unit="found",
                               method="needle string match",
                               evidence={"k/n": f"{needle.found}/{needle.total}",
                                         "clopper_pearson_90": f"[{low:.3f}, {high:.3f}]"})  # fmt: skip
    assert baseline is not None and isinstance(baseline, LlamaCppPreset)
    if metric is Metric.TEMP0_IDENTITY:
        async with (launched(preset, model, workdir / "candidate", build=build) as cand_server,
                    launched(baseline, model, workdir / "baseline", build=build) as base_server):  # fmt: skip
            t0 = await temp0_identity(cand_server, base_server)
        ones = [1.0] * (t0.identical + t0.near_ties)
        return GateMeasurement(samples=ones + [0.0] * (t0.prompts - len(ones)), unit="prompts passing",
                               method="temp-0 identity, near-tie gap < 0.25", evidence={"detail": t0.detail})  # fmt: skip
    if metric is Metric.PPL_DELTA_PCT:
        corpus = write_corpus(workdir / "corpus.txt")
        ppl = await perplexity_delta(build, preset, baseline, model, corpus, workdir)  # type: ignore[arg-type]
        return GateMeasurement(samples=[ppl.delta_pct or 0.0], unit="%", method="llama-perplexity dPPL",
                               evidence={"ppl": f"{ppl.ppl} +/- {ppl.ppl_err}",
                                         "baseline_ppl": f"{ppl.baseline_ppl} +/- {ppl.baseline_ppl_err}",
                                         "delta_err_pct": f"{ppl.delta_err_pct}"})  # fmt: skip
    raise UnsupportedMetric(f"metric {metric.value!r} has no measurement")


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
    model: Annotated[str, typer.Option(help="GGUF model path, or a tiny model name (tiny, small, medium)")],
    baseline_preset: Annotated[
        str | None, typer.Option(help="baseline preset for A/B and relative metrics")
    ] = None,
    users: Annotated[int, typer.Option(min=1)] = 1,
    rounds: Annotated[int, typer.Option(min=1)] = 7,
    max_tokens: Annotated[int, typer.Option(min=2)] = 64,
    prompt_words: Annotated[int, typer.Option(min=1)] = 32,
    workdir: Annotated[Path | None, typer.Option(help="where logs and artifacts go")] = None,
) -> None:
    # stdout carries exactly one JSON object; logs go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    workload = Workload(users=[users], rounds=rounds, max_tokens=max_tokens, prompt_words=prompt_words)
    workdir = workdir or Path(tempfile.gettempdir()) / f"daedalus-measure-{uuid.uuid4().hex[:8]}"
    try:
        model_path = ensure_model(model) if model in MODELS else Path(model)
        result = asyncio.run(measure(metric, preset, model_path, baseline_ref=baseline_preset, workload=workload,
                                     workdir=workdir))  # fmt: skip
    except EngineError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    sys.stdout.write(json.dumps(result.model_dump(mode="json")) + "\n")


if __name__ == "__main__":
    from daedalus.config import Settings
    from daedalus.engines import paths

    paths.configure(Settings.load().engines)  # `python -m` is an entry point of its own
    app()
