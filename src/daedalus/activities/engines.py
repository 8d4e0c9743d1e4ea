"""Engine activities on the host's task queue: build llama.cpp, run a benchmark, run a quality probe.

Each heartbeats its progress; results and raw samples go to the artifact directory and only a summary goes
into workflow history. A finished run's artifact makes a retry return at once (idempotent by run_id).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from temporalio import activity

from daedalus.engines.bench import Side, benchmark
from daedalus.engines.llama_build import LlamaBuild, build_llama_cpp
from daedalus.engines.measure import bench_presets
from daedalus.engines.paths import default_llama_source
from daedalus.engines.presets import load_preset
from daedalus.engines.quality import garbage, needle_probe, perplexity_delta, temp0_identity, write_corpus
from daedalus.engines.runner import launched
from daedalus.errors import InputError, PresetError, maps_errors
from daedalus.schemas.engines import (
    BenchmarkRequest,
    BenchmarkSummary,
    BenchResult,
    BuildInfo,
    BuildRequest,
    LlamaCppPreset,
    ProbeKind,
    ProbeRequest,
    ProbeSummary,
    Workload,
)


@contextlib.asynccontextmanager
async def _heartbeating(interval_s: float = 5.0) -> AsyncIterator[list[object]]:
    """Heartbeat the latest progress every few seconds, even while a step (a compile, a start-up) is silent."""
    latest: list[object] = ["started"]

    async def beat() -> None:
        while True:
            activity.heartbeat(*latest)
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(beat())
    try:
        yield latest
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _build(request: BuildRequest, latest: list[object]) -> LlamaBuild:
    def progress(done: int, total: int, line: str) -> None:
        latest[:] = [{"step": done, "of": total}]

    return await build_llama_cpp(
        request.source or default_llama_source(), jobs=request.jobs, on_progress=progress
    )


class EngineActivities:
    """Holds the host's artifact directory; the engine cache is the one the worker's entry point configured."""

    def __init__(self, artifacts: Path):
        self.artifacts = artifacts

    def _run_dir(self, kind: str, run_id: str) -> Path:
        path = self.artifacts / "engines" / kind / run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    @activity.defn(name="build_engine")
    @maps_errors
    async def build_engine(self, request: BuildRequest) -> BuildInfo:
        """Build (or reuse the cached build of) llama.cpp; cancellation kills the compiler's process group."""
        async with _heartbeating() as latest:
            build = await _build(request, latest)
        return BuildInfo(source=build.source, source_hash=build.source_hash, bin_dir=build.bin_dir)

    @activity.defn(name="run_benchmark")
    @maps_errors
    async def run_benchmark(self, request: BenchmarkRequest) -> BenchmarkSummary:
        """Benchmark a preset (A/B interleaved with a baseline, if named). A broken run is INVALID, not an error."""
        return await _benchmark(request, self._run_dir("bench", request.run_id))

    @activity.defn(name="run_quality_probe")
    @maps_errors
    async def run_quality_probe(self, request: ProbeRequest) -> ProbeSummary:
        """Temp-0 identity, needle, perplexity delta or garbage screen; the full result goes to the artifact."""
        return await _quality_probe(request, self._run_dir("probe", request.run_id))


def _summary(bench: BenchResult, artifact: Path) -> BenchmarkSummary:
    return BenchmarkSummary(
        run_id=bench.run_id,
        artifact=artifact,
        valid=bench.valid,
        invalid_reasons=bench.invalid_reasons,
        decode_tps_median={r.users: r.decode_summary.median for r in bench.results if r.decode_summary},
        flags=bench.flags,
    )


async def _benchmark(request: BenchmarkRequest, workdir: Path) -> BenchmarkSummary:
    artifact = workdir / "bench.json"
    if artifact.is_file():
        return _summary(BenchResult.model_validate_json(artifact.read_text()), artifact)
    preset = load_preset(request.preset)
    baseline = load_preset(request.baseline_preset) if request.baseline_preset else None
    async with _heartbeating() as latest:
        needs_llama = isinstance(preset, LlamaCppPreset) or isinstance(baseline, LlamaCppPreset)
        build = await _build(request.build, latest) if needs_llama else None

        def progress(done: int, total: int, what: str) -> None:
            latest[:] = [{"round": done, "of": total, "at": what}]

        # Both servers up at once only where the presets say they fit; otherwise A and B alternate.
        bench = await bench_presets(preset, baseline, request.model, workdir, build=build,
                                    workload=request.workload, run_id=request.run_id, on_progress=progress,
                                    show_progress=False)  # fmt: skip
    tmp = artifact.with_suffix(".tmp")
    tmp.write_text(bench.model_dump_json(indent=2))
    tmp.rename(artifact)
    return _summary(bench, artifact)


async def _quality_probe(request: ProbeRequest, workdir: Path) -> ProbeSummary:
    artifact = workdir / f"{request.probe.value}.json"
    summary_file = workdir / "summary.json"
    if summary_file.is_file():
        return ProbeSummary.model_validate_json(summary_file.read_text())
    preset = load_preset(request.preset)
    baseline = load_preset(request.baseline_preset) if request.baseline_preset else None
    if not isinstance(preset, LlamaCppPreset) or (
        baseline is not None and not isinstance(baseline, LlamaCppPreset)
    ):
        raise PresetError(
            f"quality probes run on llama.cpp presets on this host; {request.preset!r}"
            + (f" / {request.baseline_preset!r}" if request.baseline_preset else "")
            + " is not one (a vLLM preset is measured with `daedalus engine measure` on its GPU host)"
        )
    if request.probe in (ProbeKind.TEMP0_IDENTITY, ProbeKind.PERPLEXITY) and baseline is None:
        raise InputError(
            f"probe {request.probe.value} compares against a baseline: set baseline_preset (e.g. the same "
            "preset without the change under test)"
        )
    async with _heartbeating() as latest:
        build = await _build(request.build, latest)
        latest[:] = [{"probe": request.probe.value}]
        passed, headline, body = await _probe(request, preset, baseline, build, workdir)
    artifact.write_text(body)
    summary = ProbeSummary(run_id=request.run_id, probe=request.probe, artifact=artifact, passed=passed,
                           headline=headline)  # fmt: skip
    summary_file.write_text(summary.model_dump_json())
    return summary


async def _probe(
    request: ProbeRequest,
    preset: LlamaCppPreset,
    baseline: LlamaCppPreset | None,
    build: LlamaBuild,
    workdir: Path,
) -> tuple[bool | None, str, str]:
    model = request.model
    if request.probe is ProbeKind.TEMP0_IDENTITY:
        assert baseline is not None
        async with (launched(preset, model, workdir / "candidate", build=build) as cand,
                    launched(baseline, model, workdir / "baseline", build=build) as base):  # fmt: skip
            t0 = await temp0_identity(cand, base)
        return t0.passed, t0.detail, t0.model_dump_json(indent=2)
    if request.probe is ProbeKind.NEEDLE:
        async with launched(preset, model, workdir / "needle", build=build) as server:
            needle = await needle_probe(server)
        head = f"needle {needle.found}/{needle.total}, 90% CI [{needle.ci_low:.2f}, {needle.ci_high:.2f}]"
        return needle.found == needle.total, head, needle.model_dump_json(indent=2)
    if request.probe is ProbeKind.PERPLEXITY:
        assert baseline is not None
        corpus = request.corpus or write_corpus(workdir / "corpus.txt")
        ppl = await perplexity_delta(build, preset, baseline, model, corpus, workdir)
        head = f"PPL {ppl.ppl:.4f} vs {ppl.baseline_ppl:.4f}: dPPL {ppl.delta_pct:+.2f}% +/- {ppl.delta_err_pct:.2f}%"
        return None, head, ppl.model_dump_json(indent=2)
    async with launched(preset, model, workdir / "garbage", build=build) as server:
        side = Side(name=preset.name, server=server)
        bench = await benchmark(side, Workload(rounds=1, warmup_rounds=0, max_tokens=64), run_id=request.run_id,
                                model=str(model), show_progress=False)  # fmt: skip
    texts = [(q.text, q.completion_tokens) for r in bench.rounds for q in r.requests]
    findings = [f for text, n in texts for f in garbage(text, requested_tokens=64, completion_tokens=n)]
    head = ", ".join(sorted({f.kind.value for f in findings})) or "clean"
    body = "[" + ",".join(f.model_dump_json() for f in findings) + "]"
    return not findings, head, body
