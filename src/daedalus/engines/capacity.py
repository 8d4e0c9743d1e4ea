"""Capacity: KiB/token by difference, KV pool and compression, the concurrency ladder, the context wall."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import psutil

from daedalus.engines.base import Server
from daedalus.engines.bench import Side, run_round
from daedalus.engines.gpu import GpuUnavailable, NvmlDevice, settled_used_bytes
from daedalus.engines.llama_build import LlamaBuild
from daedalus.engines.llama_cpp import parse_kv_cache_log
from daedalus.engines.process import tail
from daedalus.engines.runner import launched
from daedalus.errors import EngineError
from daedalus.processes import group_members
from daedalus.schemas.engines import (
    CapacityResult,
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
    async with httpx.AsyncClient(timeout=60.0) as client:
        side = Side(name=server.adapter.preset.name, server=server)
        await run_round(client, side, Workload(prompt_words=8, max_tokens=4), 1, 0, warmup=True)


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


async def kib_per_token(
    preset: LlamaCppPreset,
    model: Path,
    workdir: Path,
    build: LlamaBuild,
    contexts: tuple[int, int] = (1024, 8192),
) -> tuple[float, float | None, list[KvMeasurement]]:
    """Memory at two context sizes divided by the token difference: fixed overheads cancel out.

    Host RSS for a CPU preset; NVML device memory for a CUDA preset (its cache is not in host memory).
    """
    low, high = sorted(contexts)
    if low == high:
        raise EngineError("KiB/token by difference needs two different context sizes")
    a = await kv_at(preset.model_copy(update={"context": low}), model, workdir, build)
    b = await kv_at(preset.model_copy(update={"context": high}), model, workdir, build)
    if a.gpu_used_mib is not None and b.gpu_used_mib is not None:
        by_difference = (b.gpu_used_mib - a.gpu_used_mib) * 1024 / (high - low)
    else:
        by_difference = (b.rss_mib - a.rss_mib) * 1024 / (high - low)
    reported = None
    if a.reported_kv_mib is not None and b.reported_kv_mib is not None:
        reported = (b.reported_kv_mib - a.reported_kv_mib) * 1024 / (high - low)
    return by_difference, reported, [a, b]


async def capacity(
    preset: LlamaCppPreset,
    model: Path,
    workdir: Path,
    build: LlamaBuild,
    *,
    baseline: LlamaCppPreset | None = None,
    contexts: tuple[int, int] = (1024, 8192),
) -> CapacityResult:
    """KiB/token (by RSS difference, cross-checked with the engine's own report) and compression."""
    kib, reported, measurements = await kib_per_token(preset, model, workdir, build, contexts)
    base_kib = compression = None
    if baseline is not None:
        base_kib, _, base_measurements = await kib_per_token(baseline, model, workdir, build, contexts)
        measurements += base_measurements
        compression = base_kib / kib if kib > 0 else None
    at_preset = await kv_at(preset, model, workdir, build)
    return CapacityResult(
        preset=preset.name,
        baseline_preset=baseline.name if baseline else None,
        measurements=[*measurements, at_preset],
        kib_per_token=kib,
        kib_source="nvml" if on_gpu(preset) else "rss",
        kib_per_token_reported=reported,
        baseline_kib_per_token=base_kib,
        compression=compression,
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
                async with httpx.AsyncClient(timeout=120.0) as client:
                    r = await run_round(client, Side(name=p.name, server=server), Workload(prompt_words=16,
                                        max_tokens=16), 1, 0, warmup=False)  # fmt: skip
                req = r.requests[0]
                crashed = server.process.returncode() is not None
                probes.append(WallProbe(context=ctx, ok=req.ok and not crashed, decode_tps=req.server_decode_tps,
                                        crashed=crashed, exit_code=server.process.returncode(),
                                        detail=req.error or ""))  # fmt: skip
        except EngineError as exc:
            log_path = workdir / f"wall-{ctx}" / f"server-{p.name}.log"
            probes.append(WallProbe(context=ctx, ok=False, crashed=True, detail=str(exc).splitlines()[0]))
            findings.append(f"context {ctx}: the server crashed (a finding, not a harness error); "
                            f"log {log_path}:\n{tail(log_path, 5)}")  # fmt: skip
        if not probes[-1].ok:
            break
    ok = [p.context for p in probes if p.ok]
    failed = [p.context for p in probes if not p.ok]
    return WallResult(preset=preset.name, probes=probes, wall_context=max(ok) if ok else None,
                      first_failure=min(failed) if failed else None, findings=findings)  # fmt: skip
