"""vLLM over its real protocol, end to end through `measure`, against tests/fixtures/fake_vllm.py: a process
that takes vLLM's command line, prints vLLM's start-up lines and speaks its HTTP API (served model name only,
streamed usage, legacy logprobs with token ids, /metrics spec-decode counters)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from daedalus.engines.measure import measure
from daedalus.engines.openai_api import ApiError, OpenAIEndpoint
from daedalus.engines.presets import load_preset
from daedalus.engines.process import EngineError
from daedalus.engines.provenance import resolve_model
from daedalus.engines.runner import launched
from daedalus.gates.verdicts import decide
from daedalus.schemas.engines import VllmPreset, Workload
from daedalus.schemas.gates import GateSpec, Metric, Verdict

FAKE = Path(__file__).parents[1] / "fixtures" / "fake_vllm.py"
HF_ID = "Qwen/Qwen3-30B-A3B"


@pytest.fixture
def presets(tmp_path: Path) -> tuple[str, str]:
    """An MTP3 preset and its AR baseline, both served by the fake `vllm`."""
    exe = tmp_path / "vllm"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    exe.chmod(0o755)
    common = {"engine": "vllm", "max_model_len": 16384, "tensor_parallel_size": 4, "executable": str(exe),
              "kv_cache_dtype": "tq_4bit_nc", "health_timeout_s": 60}  # fmt: skip
    mtp = tmp_path / "mtp3.yaml"
    mtp.write_text(yaml.safe_dump({**common, "name": "mtp3", "speculative": {"method": "mtp",
                                                                            "num_speculative_tokens": 3}}))  # fmt: skip
    ar = tmp_path / "ar.yaml"
    ar.write_text(yaml.safe_dump({**common, "name": "ar"}))
    return str(mtp), str(ar)


def gate(metric: str, threshold: float, **extra: object) -> GateSpec:
    return GateSpec.model_validate(
        {"name": metric, "metric": metric, "threshold": threshold, "command": "x", **extra}
    )


async def test_served_model_name_comes_from_the_server(presets: tuple[str, str], tmp_path: Path) -> None:
    preset = load_preset(presets[0])
    assert isinstance(preset, VllmPreset)
    async with launched(preset, Path(HF_ID), tmp_path / "s", build=None) as server:
        assert await server.endpoint().served_model() == "mtp3"
        stale = OpenAIEndpoint(server.base_url, model="default")  # what the benchmark used to send
        with pytest.raises(ApiError, match="The model `default` does not exist"):
            await stale.greedy("hello", 4)
        stream = await server.endpoint().greedy("The capital of France is", 5)
    assert len(stream.token_ids) == 5 and stream.top2_gaps == pytest.approx([0.8] * 5)


async def test_capacity_from_the_start_up_log_is_deterministic(
    presets: tuple[str, str], tmp_path: Path
) -> None:
    pool = await measure(Metric.KV_POOL_TOKENS, presets[0], HF_ID, workdir=tmp_path / "pool")
    assert pool.samples == [1_006_896.0] and pool.invalid_reason is None
    result = decide(gate("kv_pool_tokens", 369_712), pool)
    assert result.verdict is Verdict.PASS and "deterministic" in result.reason
    conc = await measure(Metric.MAX_CONCURRENCY, presets[0], HF_ID, workdir=tmp_path / "conc")
    assert conc.samples == [61.46]
    # The provenance names the hub id (not hashed), the preset and where the raw data is.
    assert (
        pool.provenance is not None
        and pool.provenance.model == HF_ID
        and pool.provenance.model_sha256 is None
    )
    assert pool.provenance.engine == "vllm" and pool.provenance.artifacts == str(
        (tmp_path / "pool").resolve()
    )


async def test_acceptance_length_and_position_acceptance_are_gate_metrics(
    presets: tuple[str, str], tmp_path: Path
) -> None:
    workload = Workload(rounds=5, max_tokens=60, prompt_words=8)
    length = await measure(
        Metric.ACCEPTANCE_LENGTH, presets[0], HF_ID, workload=workload, workdir=tmp_path / "a"
    )
    assert length.invalid_reason is None and len(length.samples) == 5
    assert all(2.5 < s < 3.5 for s in length.samples), length.samples  # the fake's pattern: ~2.98
    assert decide(gate("acceptance_length", 2.5), length).verdict is Verdict.PASS
    first = await measure(Metric.POSITION_ACCEPTANCE, presets[0], HF_ID, workload=workload, workdir=tmp_path / "p",
                          position=1)  # fmt: skip
    third = await measure(Metric.POSITION_ACCEPTANCE, presets[0], HF_ID, workload=workload, workdir=tmp_path / "q",
                          position=3)  # fmt: skip
    assert all(0.9 <= s <= 1.0 for s in first.samples) and all(0.1 < s < 0.6 for s in third.samples)
    plain = await measure(
        Metric.ACCEPTANCE_LENGTH, presets[1], HF_ID, workload=workload, workdir=tmp_path / "r"
    )
    assert plain.invalid_reason and "drafted" in plain.invalid_reason


async def test_ab_alternates_residency_on_vllm_and_keeps_the_pairs(
    presets: tuple[str, str], tmp_path: Path
) -> None:
    workload = Workload(rounds=5, max_tokens=32, prompt_words=8, warmup_rounds=1)
    ab = await measure(Metric.DECODE_TPS, presets[0], HF_ID, baseline_ref=presets[1], workload=workload,
                       workdir=tmp_path / "ab")  # fmt: skip
    assert ab.invalid_reason is None, ab.invalid_reason
    assert ab.baseline_samples is not None and len(ab.samples) == len(ab.baseline_samples) == 5
    assert "alternating residency" in ab.method
    bench = json.loads((tmp_path / "ab" / "bench.json").read_text())
    starts = sorted(p.name for p in (tmp_path / "ab").iterdir() if "-start" in p.name)
    assert len(starts) == 10, "one start per side per measured round"
    # Each start warms up before its measured round.
    assert sum(r["warmup"] for r in bench["rounds"]) == 10 and bench["residency"] == "alternating"
    # MTP3 yields ~3 tokens a step, AR one: the candidate is faster per user.
    assert decide(gate("decode_tps", 1.5, kind="ab"), ab).verdict is Verdict.PASS


async def test_temp0_identity_over_vllm_logprobs(presets: tuple[str, str], tmp_path: Path) -> None:
    same = await measure(Metric.TEMP0_IDENTITY, presets[0], HF_ID, baseline_ref=presets[1], probes=12,
                         workdir=tmp_path / "t")  # fmt: skip
    assert same.samples == [1.0] * 12 and "12 identical" in same.evidence["detail"]


def test_models_as_vllm_takes_them(tmp_path: Path) -> None:
    preset = load_preset("vllm-single-user-mtp3")
    assert resolve_model(HF_ID, [preset]) == Path(HF_ID)
    hf_dir = tmp_path / "Qwen3"
    hf_dir.mkdir()
    with pytest.raises(EngineError, match=r"without config\.json"):
        resolve_model(str(hf_dir), [preset])
    (hf_dir / "config.json").write_text("{}")
    assert resolve_model(str(hf_dir), [preset]) == hf_dir.resolve()
    with pytest.raises(EngineError, match="GGUF"):
        resolve_model(str(hf_dir), [preset, load_preset("local-f16")])
    with pytest.raises(EngineError, match="neither a file"):
        resolve_model("./missing", [preset])
