"""A real llama-server on the CPU: launch, benchmark, stop, and every bad input the issue names."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import pytest

from daedalus.engines.bench import Side, benchmark
from daedalus.engines.llama_build import LlamaBuild
from daedalus.engines.presets import load_preset, parse_preset
from daedalus.engines.runner import launched
from daedalus.errors import EngineError
from daedalus.ports import free_port
from daedalus.processes import group_members
from daedalus.schemas.engines import LlamaCppPreset, Workload

pytestmark = pytest.mark.llama


def _preset(name: str) -> LlamaCppPreset:
    preset = load_preset(name)
    assert isinstance(preset, LlamaCppPreset)
    return preset


async def test_benchmark_is_valid_and_the_group_is_gone_after(
    llama_build: LlamaBuild, small_model: Path, tmp_path: Path
) -> None:
    workload = Workload(users=[1, 4], rounds=5, max_tokens=32, prompt_words=16)
    async with launched(_preset("local-f16-4users"), small_model, tmp_path, build=llama_build) as server:
        pgid = server.process.pid
        result = await benchmark(
            Side("local-f16-4users", server), workload, run_id="t", model=str(small_model)
        )
    assert result.valid, result.invalid_reasons
    assert [r.users for r in result.results] == [1, 4]
    for r in result.results:
        assert r.timing_source == "server" and len(r.decode_tps) == 5
        summary = r.decode_summary
        assert summary is not None and summary.ci_low is not None and summary.ci_low <= summary.median
        assert all(t > 0 for t in r.ttft_ms + r.tpot_ms)
    measured = [q for rnd in result.rounds if not rnd.warmup for q in rnd.requests]
    assert len(measured) == 5 * 1 + 5 * 4 and all(q.completion_tokens == 32 for q in measured)
    assert len({rnd.requests[0].text for rnd in result.rounds}) > 1, "fresh prompts give different outputs"
    assert result.prefix_cache_hits == 0 and result.preemptions == 0
    assert group_members(pgid) == []


async def test_more_users_than_slots_is_invalid(
    llama_build: LlamaBuild, tiny_model: Path, tmp_path: Path
) -> None:
    workload = Workload(users=[4], rounds=2, max_tokens=64, prompt_words=8)
    async with launched(_preset("local-f16"), tiny_model, tmp_path, build=llama_build) as server:
        result = await benchmark(Side("local-f16", server), workload, run_id="t", model=str(tiny_model))
    assert not result.valid
    assert any("deferred" in r for r in result.invalid_reasons), result.invalid_reasons


async def test_server_dying_mid_benchmark_is_invalid_with_evidence(
    llama_build: LlamaBuild, small_model: Path, tmp_path: Path
) -> None:
    workload = Workload(users=[1], rounds=50, max_tokens=256, prompt_words=8)
    async with launched(_preset("local-f16"), small_model, tmp_path, build=llama_build) as server:
        pgid = server.process.pid

        async def kill_soon() -> None:
            await asyncio.sleep(1.0)
            os.killpg(pgid, signal.SIGKILL)

        killer = asyncio.create_task(kill_soon())
        result = await benchmark(Side("local-f16", server), workload, run_id="t", model=str(small_model))
        await killer
    assert not result.valid
    assert any("died" in r for r in result.invalid_reasons), result.invalid_reasons
    assert result.server_log is not None and Path(result.server_log).is_file()
    assert group_members(pgid) == []


async def test_bad_inputs_leave_no_process(llama_build: LlamaBuild, tiny_model: Path, tmp_path: Path) -> None:
    before = {p.pid for p in group_members(os.getpgid(0))}
    with pytest.raises(EngineError, match="does not exist"):
        async with launched(_preset("local-f16"), tmp_path / "no.gguf", tmp_path, build=llama_build):
            pass
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(EngineError, match=f"port {port} is in use"):
            async with launched(_preset("local-f16"), tiny_model, tmp_path, build=llama_build, port=port):
                pass
    turbo = parse_preset(
        {
            "engine": "llama.cpp",
            "name": "turbo",
            "cache_type_k": "turbo3",
            "cache_type_v": "turbo3",
            "env": {"TURBO_AUTO_ASYMMETRIC": "0"},
        }
    )
    assert isinstance(turbo, LlamaCppPreset)
    with pytest.raises(EngineError, match=r"cache_type_k 'turbo3'.*does not know; known: .*q8_0"):
        async with launched(turbo, tiny_model, tmp_path, build=llama_build, port=free_port()):
            pass
    # A server that exits during start-up: the error carries the log tail, and nothing is left running.
    broken = _preset("local-f16").model_copy(update={"extra_args": ["--no-such-flag"]})
    with pytest.raises(EngineError, match="exited with code"):
        async with launched(broken, tiny_model, tmp_path, build=llama_build):
            pass
    assert {p.pid for p in group_members(os.getpgid(0))} == before
