"""The one OpenAI-compatible client path against a real server speaking the protocol: llama-server's own
/v1/models and /v1/completions (streamed with usage, and with logprobs), on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from daedalus.engines.bench import Side, benchmark
from daedalus.engines.llama_build import LlamaBuild
from daedalus.engines.measure import measure
from daedalus.engines.openai_api import OpenAIEndpoint
from daedalus.engines.presets import load_preset
from daedalus.engines.quality import identity_probes, temp0_identity
from daedalus.engines.runner import launched
from daedalus.gates.verdicts import judge
from daedalus.schemas.engines import LlamaCppPreset, Workload
from daedalus.schemas.gates import GateSpec, Metric, Verdict

pytestmark = pytest.mark.llama


def _preset(name: str) -> LlamaCppPreset:
    preset = load_preset(name)
    assert isinstance(preset, LlamaCppPreset)
    return preset


async def test_served_model_stream_and_logprobs(
    llama_build: LlamaBuild, tiny_model: Path, tmp_path: Path
) -> None:
    async with launched(_preset("local-f16"), tiny_model, tmp_path, build=llama_build) as server:
        api = server.endpoint()
        name = await api.served_model()
        assert name and isinstance(name, str)
        sample = await api.stream_completion("the key value is", max_tokens=16, seed=0, user=0)
        greedy = await api.greedy("The capital of France is", 8)
        again = await OpenAIEndpoint(server.base_url, extra={"cache_prompt": False}).greedy(
            "The capital of France is", 8
        )
    assert (
        sample.ok and sample.completion_tokens == 16 and sample.server_decode_tps and sample.client_decode_tps
    )
    # How closely client and server timings agree is bench/harness_fidelity.py's question, not a test's.
    assert len(greedy.token_ids) == 8 and all(g is not None and g >= 0 for g in greedy.top2_gaps)
    assert again.token_ids == greedy.token_ids, "temperature 0 is deterministic"


async def test_speculative_acceptance_from_llama_server_metrics(
    llama_build: LlamaBuild, small_model: Path, tmp_path: Path
) -> None:
    async with launched(_preset("local-spec-self"), small_model, tmp_path, build=llama_build) as server:
        result = await benchmark(Side("local-spec-self", server), Workload(rounds=2, max_tokens=24, prompt_words=8),
                                 run_id="spec", model=str(small_model))  # fmt: skip
    measured = [r for r in result.rounds if not r.warmup]
    # Self-drafting accepts (nearly) every draft: acceptance length well above 1.
    assert all(r.acceptance_length is not None and r.acceptance_length > 1.5 for r in measured), measured
    assert all(r.position_acceptance and 0 < r.position_acceptance[0] <= 1 for r in measured)


async def test_identity_probes_over_v1_completions(
    llama_build: LlamaBuild, small_model: Path, tmp_path: Path
) -> None:
    probes = identity_probes(6)
    async with (
        launched(_preset("local-spec-self"), small_model, tmp_path / "spec", build=llama_build) as spec,
        launched(_preset("local-f16"), small_model, tmp_path / "ar", build=llama_build) as ar,
    ):
        result = await temp0_identity(spec, ar, probes=probes, n_tokens=16)
    # Speculative decoding verifies every draft with the target model, so each probe is either identical or a
    # near-tie flip (batched verification may round a near-tie the other way on this CPU); never a real miss.
    assert result.passed and result.identical + result.near_ties == 6, result.detail
    assert result.identical >= 1, result.detail


async def test_measure_keeps_provenance_and_artifacts(
    llama_build: LlamaBuild, tiny_model: Path, tmp_path: Path
) -> None:
    workload = Workload(rounds=5, max_tokens=16, prompt_words=8)
    measured = await measure(
        Metric.DECODE_TPS, "local-f16", tiny_model, workload=workload, workdir=tmp_path / "m"
    )
    assert measured.provenance is not None and len(measured.samples) == 5
    p = measured.provenance
    assert p.engine == "llama.cpp" and p.engine_build == llama_build.source_hash and p.engine_flags
    assert p.model == str(tiny_model.resolve()) and p.model_sha256 and p.preset == "local-f16"
    assert p.artifacts == str((tmp_path / "m").resolve()) and (tmp_path / "m" / "bench.json").is_file()
    gate = GateSpec(name="decode", metric="decode_tps", threshold=1.0, command="x")
    result = judge(gate, measured, host="pc", commit="abc")
    assert (
        result.verdict is Verdict.PASS and result.provenance is not None and result.provenance.commit == "abc"
    )
