"""Launch a preset's server on this host: pick the adapter, a free port, a log under the run's directory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from daedalus.engines import startup_clock
from daedalus.engines.base import EngineAdapter, Server
from daedalus.engines.llama_build import LlamaBuild
from daedalus.engines.llama_cpp import LlamaCppAdapter
from daedalus.engines.vllm import VllmAdapter
from daedalus.errors import EngineSetupError
from daedalus.ports import free_port
from daedalus.schemas.engines import LlamaCppPreset, VllmPreset


def adapter_for(preset: LlamaCppPreset | VllmPreset, build: LlamaBuild | None) -> EngineAdapter:
    if isinstance(preset, VllmPreset):
        return VllmAdapter(preset)
    if build is None:
        raise EngineSetupError(
            f"preset {preset.name} needs a llama.cpp build; run `daedalus engine build` first"
        )
    return LlamaCppAdapter(build, preset)


@asynccontextmanager
async def launched(
    preset: LlamaCppPreset | VllmPreset,
    model: Path,
    workdir: Path,
    *,
    build: LlamaBuild | None,
    port: int | None = None,
    memory_limit_bytes: int | None = None,
    timeout_s: float | None = None,
) -> AsyncIterator[Server]:
    """A healthy server for the duration of the block; its whole process group is gone afterwards.

    The health wait is the preset's `health_timeout_s` unless `timeout_s` overrides it. The start is recorded on
    the process's start-up clock, when it has one (a gate's measuring time does not count it)."""
    adapter = adapter_for(preset, build)
    workdir.mkdir(parents=True, exist_ok=True)
    limit_s = timeout_s if timeout_s is not None else preset.health_timeout_s
    with startup_clock.starting(preset.name, limit_s):
        server = await adapter.launch(
            model,
            port or free_port(),
            workdir / f"server-{preset.name}.log",
            timeout_s=limit_s,
            memory_limit_bytes=memory_limit_bytes,
        )
    async with server:
        yield server


@asynccontextmanager
async def launched_together(
    *launches: tuple[LlamaCppPreset | VllmPreset, Path, Path],
    build: LlamaBuild | None,
) -> AsyncIterator[list[Server]]:
    """Several healthy servers at once, started concurrently: an A/B's two vLLM starts overlap instead of adding
    up (each waits on its own imports and model load as much as on the CPU). If one start fails, the others are
    stopped and the first error is raised; every process group is gone when the block ends."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(preset: LlamaCppPreset | VllmPreset, model: Path, workdir: Path) -> Server:
            return await stack.enter_async_context(launched(preset, model, workdir, build=build))

        tasks = [asyncio.ensure_future(start(*launch)) for launch in launches]
        try:
            servers = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        yield list(servers)
