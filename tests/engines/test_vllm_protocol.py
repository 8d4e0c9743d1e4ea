"""What vLLM's CPU build cannot do, end to end through `measure`, against tests/fixtures/fake_vllm.py: the fork's
MTP speculative decoding, its tq_* KV dtypes and --additional-config, on a TP4 preset named by a hub id. The
stand-in takes vLLM's command line, prints vLLM's GPU start-up lines and speaks its HTTP API; it is not vLLM, and
every test here says so in its name. Everything vLLM's CPU build can do is tested against it, for real, in
test_vllm_engine.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from daedalus.engines.measure import measure
from daedalus.engines.presets import load_preset
from daedalus.engines.provenance import resolve_model
from daedalus.errors import EngineError
from daedalus.gates.verdicts import judge
from daedalus.schemas.engines import Workload
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


async def test_fork_tq_kv_capacity_of_a_hub_model_on_the_stand_in(
    presets: tuple[str, str], tmp_path: Path
) -> None:
    pool = await measure(Metric.KV_POOL_TOKENS, presets[0], HF_ID, workdir=tmp_path / "pool")
    assert pool.samples == [1_006_896.0] and pool.invalid_reason is None
    result = judge(gate("kv_pool_tokens", 369_712), pool)
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


async def test_fork_mtp_acceptance_length_and_position_curve_on_the_stand_in(
    presets: tuple[str, str], tmp_path: Path
) -> None:
    workload = Workload(rounds=5, max_tokens=60, prompt_words=8)
    length = await measure(
        Metric.ACCEPTANCE_LENGTH, presets[0], HF_ID, workload=workload, workdir=tmp_path / "a"
    )
    assert length.invalid_reason is None and len(length.samples) == 5
    assert all(2.5 < s < 3.5 for s in length.samples), length.samples  # the fake's pattern: ~2.98
    assert judge(gate("acceptance_length", 2.5), length).verdict is Verdict.PASS
    first = await measure(Metric.POSITION_ACCEPTANCE, presets[0], HF_ID, workload=workload, workdir=tmp_path / "p",
                          position=1)  # fmt: skip
    third = await measure(Metric.POSITION_ACCEPTANCE, presets[0], HF_ID, workload=workload, workdir=tmp_path / "q",
                          position=3)  # fmt: skip
    assert all(0.9 <= s <= 1.0 for s in first.samples) and all(0.1 < s < 0.6 for s in third.samples)
    plain = await measure(
        Metric.ACCEPTANCE_LENGTH, presets[1], HF_ID, workload=workload, workdir=tmp_path / "r"
    )
    assert plain.invalid_reason and "drafted" in plain.invalid_reason


async def test_fork_mtp_ab_in_alternating_residency_on_the_stand_in(
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
    assert judge(gate("decode_tps", 1.5, kind="ab"), ab).verdict is Verdict.PASS


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
