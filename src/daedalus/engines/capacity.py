"""Capacity: KiB/token by difference, KV pool and compression, the concurrency ladder, the context wall."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil

from daedalus.engines.base import Server
from daedalus.engines.bench import Side, run_round
from daedalus.engines.gpu import GpuUnavailable, NvmlDevice, settled_used_bytes
from daedalus.engines.llama_build import LlamaBuild
from daedalus.engines.llama_cpp import parse_kv_cache_log
from daedalus.engines.runner import launched
from daedalus.errors import EngineError
from daedalus.processes import group_members, log_tail
from daedalus.schemas.engines import (
    CapacityResult,
    KibPerTokenFit,
    KvMeasurement,
    LadderStep,
    LlamaCppPreset,
    WallProbe,
    WallResult,
    Workload,
)

MIB = 1024 * 1024


def group_rss(pgid: int) -> int:
    """Resident bytes of every process in the server's group."""
    total = 0
    for proc in group_members(pgid):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


async def _warm(server: Server) -> None:
    # One short generation so compute buffers are touched at both sizes and cancel out in the difference.
    side = Side(name=server.adapter.preset.name, server=server)
    await run_round(side, Workload(prompt_words=8, max_tokens=4, request_timeout_s=60.0), 1, 0, warmup=True)


def on_gpu(preset: LlamaCppPreset) -> bool:
    return preset.backend == "cuda" and preset.n_gpu_layers > 0


def gpu_device(preset: LlamaCppPreset) -> NvmlDevice | None:
    """NVML for a CUDA preset: its KV cache lives in device memory, which host RSS does not see."""
    if not on_gpu(preset):
        return None
    try:
        return NvmlDevice(0)
    except GpuUnavailable as exc:
        raise EngineError(
            f"preset {preset.name} runs on the GPU, so KiB/token is read from NVML: {exc}"
        ) from None


async def kv_at(preset: LlamaCppPreset, model: Path, workdir: Path, build: LlamaBuild) -> KvMeasurement:
    device = gpu_device(preset)
    async with launched(preset, model, workdir / f"ctx{preset.context}", build=build) as server:
        await _warm(server)
        rss = group_rss(server.process.pid)
        gpu_used = await asyncio.to_thread(settled_used_bytes, device) if device is not None else None
        caches = parse_kv_cache_log(server.log_text())
    return KvMeasurement(
        preset=preset.name,
        context=preset.context,
        reported_kv_mib=caches[0].mib if caches else None,
        rss_mib=rss / MIB,
        gpu_used_mib=gpu_used / MIB if gpu_used is not None else None,
        pool_tokens=caches[0].cells if caches else None,
    )


DEFAULT_CONTEXTS = (1024, 2048, 4096, 8192)


def fit_kib_per_token(measurements: list[KvMeasurement]) -> tuple[float, float, int]:
    """Least-squares slope of memory (device MiB where every reading has it, else resident MiB) over context tokens, in KiB/token, its standard error and the
    fit's residual degrees of freedom. Fixed overheads land in the intercept, so they never bias the slope."""
    contexts = sorted({m.context for m in measurements})
    if len(contexts) < 3:
        raise EngineError(
            f"KiB/token as a slope needs at least 3 different context sizes (got {contexts}): "
            "two points give a slope with no error estimate"
        )
    from scipy import stats

    on_device = all(m.gpu_used_mib is not None for m in measurements)
    memory = [
        float(m.gpu_used_mib if on_device and m.gpu_used_mib is not None else m.rss_mib) for m in measurements
    ]
    fit = stats.linregress([m.context for m in measurements], memory)
    return float(fit.slope) * 1024, float(fit.stderr) * 1024, len(measurements) - 2


async def kib_per_token(
    preset: LlamaCppPreset,
    model: Path,
    workdir: Path,
    build: LlamaBuild,
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS,
) -> KibPerTokenFit:
    """Memory at several context sizes; KiB/token is the fitted slope, with its standard error.

    Host RSS for a CPU preset; NVML device memory for a CUDA preset (its cache is not in host memory).
    """
    measurements = [
        await kv_at(preset.model_copy(update={"context": ctx}), model, workdir, build)
        for ctx in sorted(contexts)
    ]
    slope, se, dof = fit_kib_per_token(measurements)
    reported = [m for m in measurements if m.reported_kv_mib is not None]
    engine_slope = None
    if len(reported) >= 2:
        # The engine's own KV size is exactly linear in the context: two points give its slope.
        first, last = reported[0], reported[-1]
        assert first.reported_kv_mib is not None and last.reported_kv_mib is not None
        engine_slope = (last.reported_kv_mib - first.reported_kv_mib) * 1024 / (last.context - first.context)
    return KibPerTokenFit(
        kib_per_token=slope, standard_error=se, dof=dof, reported_kib_per_token=engine_slope,
        measurements=measurements,
    )  # fmt: skip


async def capacity(
    preset: LlamaCppPreset,
    model: Path,
    workdir: Path,
    build: LlamaBuild,
    *,
    baseline: LlamaCppPreset | None = None,
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS,
) -> CapacityResult:
    """KiB/token (slope of RSS over context, cross-checked with the engine's own report) and compression."""
    fit = await kib_per_token(preset, model, workdir, build, contexts)
    measurements = list(fit.measurements)
    base_fit = None
    compression = compression_se = None
    if baseline is not None:
        base_fit = await kib_per_token(baseline, model, workdir, build, contexts)
        measurements += base_fit.measurements
        if fit.kib_per_token > 0 and base_fit.kib_per_token > 0:
            compression = base_fit.kib_per_token / fit.kib_per_token
            # Delta method for a ratio of two independent fits.
            compression_se = (
                compression
                * (
                    (fit.standard_error / fit.kib_per_token) ** 2
                    + (base_fit.standard_error / base_fit.kib_per_token) ** 2
                )
                ** 0.5
            )
    at_preset = await kv_at(preset, model, workdir, build)
    return CapacityResult(
        preset=preset.name,
        baseline_preset=baseline.name if baseline else None,
        measurements=[*measurements, at_preset],
        contexts=sorted(contexts),
        kib_per_token=fit.kib_per_token,
        kib_source="nvml" if on_gpu(preset) else "rss",
        kib_per_token_se=fit.standard_error,
        fit_dof=fit.dof,
        kib_per_token_reported=fit.reported_kib_per_token,
        baseline_kib_per_token=base_fit.kib_per_token if base_fit else None,
        baseline_kib_per_token_se=base_fit.standard_error if base_fit else None,
        compression=compression,
        compression_se=compression_se,
        pool_tokens=at_preset.pool_tokens,
    )


async def ladder(
    preset: LlamaCppPreset,
    model: Path,
    workdir: Path,
    build: LlamaBuild,
    *,
    users: tuple[int, ...] = (1, 2, 4),
    context_per_user: int = 256,
    max_tokens: int = 16,
) -> list[LadderStep]:
    """N users x L context each, all at once: a step passes only with zero failures and zero deferrals."""
    steps: list[LadderStep] = []
    for n in users:
        step_preset = preset.model_copy(update={"parallel": n, "context": n * context_per_user})
        # Prompts fill about half of each user's context (a word is >= 1 token in the tiny vocabulary).
        workload = Workload(users=[n], prompt_words=context_per_user // 3, max_tokens=max_tokens, rounds=1,
                            warmup_rounds=0)  # fmt: skip
        async with launched(step_preset, model, workdir / f"ladder-{n}", build=build) as server:
            from daedalus.engines.bench import benchmark

            result = await benchmark(Side(name=step_preset.name, server=server), workload, run_id="ladder",
                                     model=str(model), show_progress=False)  # fmt: skip
        steps.append(LadderStep(
            users=n, context=context_per_user, passed=result.valid, failed_requests=result.failed_requests,
            token_count_mismatches=result.token_count_mismatches, preemptions=result.preemptions,
            detail="; ".join(result.invalid_reasons),
        ))  # fmt: skip
    return steps


async def wall_sweep(
    preset: LlamaCppPreset,
    model: Path,
    workdir: Path,
    build: LlamaBuild,
    *,
    contexts: tuple[int, ...],
    memory_limit_bytes: int | None = None,
) -> WallResult:
    """Ascending contexts, one user each; the first that fails ends the sweep. A crash is a finding."""
    probes: list[WallProbe] = []
    findings: list[str] = []
    for ctx in sorted(contexts):
        p = preset.model_copy(update={"context": ctx, "parallel": 1})
        try:
            async with launched(p, model, workdir / f"wall-{ctx}", build=build,
                                memory_limit_bytes=memory_limit_bytes, timeout_s=60.0) as server:  # fmt: skip
                r = await run_round(Side(name=p.name, server=server), Workload(prompt_words=16, max_tokens=16),
                                    1, 0, warmup=False)  # fmt: skip
                req = r.requests[0]
                crashed = server.process.returncode() is not None
                probes.append(WallProbe(context=ctx, ok=req.ok and not crashed, decode_tps=req.server_decode_tps,
                                        crashed=crashed, exit_code=server.process.returncode(),
                                        detail=req.error or ""))  # fmt: skip
        except EngineError as exc:
            log_path = workdir / f"wall-{ctx}" / f"server-{p.name}.log"
            probes.append(WallProbe(context=ctx, ok=False, crashed=True, detail=str(exc).splitlines()[0]))
            findings.append(f"context {ctx}: the server crashed (a finding, not a harness error); "
                            f"log {log_path}:\n{log_tail(log_path, lines=5, missing='(no log written)')}")  # fmt: skip
        if not probes[-1].ok:
            break
    ok = [p.context for p in probes if p.ok]
    failed = [p.context for p in probes if not p.ok]
    return WallResult(preset=preset.name, probes=probes, wall_context=max(ok) if ok else None,
                      first_failure=min(failed) if failed else None, findings=findings)  # fmt: skip
