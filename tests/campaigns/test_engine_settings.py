"""A campaign over llama.cpp's serving settings (the GPU issue's sweep): flash attention, (batch, micro-batch) and
threads as axes beside KV type, each cell's preset carrying them to llama-server, and decode as a fraction of the
bandwidth floor where a GPU measures it.

The H200 runs examples/campaigns/h200-engine-settings.yaml (`bench/gpu.py campaign`); here the same axes run on the
CPU build and the tiny model, and the floor's arithmetic and its refusal on a CPU preset are checked, so a change
that breaks the GPU sweep fails here first."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
import yaml
from pydantic import ValidationError

from daedalus.campaigns.cells import cell_preset, floor_interval, measure_cell
from daedalus.campaigns.spec import load_campaign
from daedalus.gates.statistics import summarize
from daedalus.report.sections import floor_cell
from daedalus.schemas.campaigns import CampaignAxes, CampaignSpec, CellOutcome

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "campaigns"


def local_spec(**axes: object) -> CampaignSpec:
    base = load_campaign(EXAMPLES / "local-kv-matrix.yaml")
    return base.model_copy(
        update={"axes": CampaignAxes.model_validate({"kv": ["f16", "q8_0"], "context": [256], **axes})}
    )


def test_the_h200_sweep_is_kv_by_flash_attention_by_batch_by_threads_and_names_what_cannot_run() -> None:
    spec = load_campaign(EXAMPLES / "h200-engine-settings.yaml")
    cells = spec.cells()
    assert len(cells) == 2 * 2 * 2 * 2 and spec.probe_floor
    assert len({c.key for c in cells}) == len({c.preset_name for c in cells}) == len(cells)
    refused = []
    for cell in cells:
        try:
            preset = cell_preset(spec, cell)
        except ValidationError as error:
            refused.append((cell, str(error)))
            continue
        assert (preset.flash_attn, (preset.batch_size, preset.ubatch_size), preset.threads) == (
            cell.flash_attn,
            cell.batch,
            cell.threads,
        )
        assert preset.backend == "cuda" and preset.cache_type_k == preset.cache_type_v == cell.kv
    # A quantized V cache needs flash attention: exactly its flash-attention-off cells cannot run.
    assert sorted(c.preset_name for c, _ in refused) == sorted(
        c.preset_name for c in cells if c.kv == "q8_0" and c.flash_attn == "off"
    )
    assert all("needs flash_attn 'on'" in why for _, why in refused)


def test_engine_settings_are_llama_cpp_axes_and_bad_values_say_which() -> None:
    with pytest.raises(ValidationError, match=r"micro-batch <= batch"):
        CampaignAxes(kv=["f16"], context=[256], batch=[(128, 512)])
    with pytest.raises(ValidationError, match=r"threads must be 1..1024"):
        CampaignAxes(kv=["f16"], context=[256], threads=[0])
    vllm = load_campaign(EXAMPLES / "local-vllm-spec-search.yaml")
    vllm = vllm.model_copy(update={"axes": CampaignAxes(kv=["auto"], context=[1024], flash_attn=["off"])})
    with pytest.raises(
        ValueError, match=r"axes flash_attn are llama.cpp settings; vllm-cpu-ar is a vLLM preset"
    ):
        cell_preset(vllm, vllm.cells()[0])


def test_a_floor_fraction_interval_is_the_decode_interval_in_other_units() -> None:
    rounds = [812.0, 798.5, 805.1, 820.3, 801.7, 809.9, 815.2]
    floor = 2192.3
    decode = summarize(rounds)
    summary = summarize([r / floor for r in rounds])
    fractions = (summary.median, summary.ci_low, summary.ci_high)
    shown = floor_interval(decode.median, decode.ci_low, decode.ci_high, floor)
    assert shown["floor_fraction"] == pytest.approx(fractions[0])
    assert (shown["floor_ci_low"], shown["floor_ci_high"]) == (
        pytest.approx(fractions[1]),
        pytest.approx(fractions[2]),
    )
    evidence = {k: str(v) for k, v in shown.items()}
    assert floor_cell(evidence) == f"{fractions[0]:.3f} [{fractions[1]:.3f}, {fractions[2]:.3f}]"
    assert floor_cell({}) == "-"


async def test_probe_floor_on_a_cpu_preset_is_an_invalid_cell_that_says_why(tmp_path: Path) -> None:
    spec = local_spec().model_copy(update={"probe_floor": True})
    result = await measure_cell(spec, spec.cells()[0], tmp_path / "cell")
    assert result.outcome is CellOutcome.INVALID, result
    assert "runs on the CPU" in result.detail and "the shipped gpu-f16" in result.detail
    assert not any(
        p.name == "llama-server" for p in psutil.process_iter(["name"]) if p.ppid() == psutil.Process().pid
    )


@pytest.mark.timeout(600)
async def test_a_cell_runs_llama_server_with_its_flash_attention_batch_and_threads(tmp_path: Path) -> None:
    spec = local_spec(flash_attn=["off"], batch=[(256, 64)], threads=[1]).model_copy(
        update={"rounds": 5, "max_tokens": 16, "probe_needle": False, "model": "tiny"}
    )
    cell = spec.cells()[0]
    assert cell.key == "kv=f16/context=256/users=1/flash_attn=off/batch=256x64/threads=1"
    result = await measure_cell(spec, cell, tmp_path / "cell")
    assert result.outcome is CellOutcome.MEASURED, result
    assert result.decode_tps is not None and len(result.samples) == 5 and result.floor_fraction is None
    preset = yaml.safe_load(Path(result.evidence["preset"]).read_text())
    assert (preset["flash_attn"], preset["batch_size"], preset["ubatch_size"], preset["threads"]) == (
        "off",
        256,
        64,
        1,
    )
    # what llama-server itself says it runs with
    (log,) = (tmp_path / "cell" / "decode").rglob("server-*.log")
    said = " ".join(log.read_text(errors="replace").split())
    for line in (
        "n_batch = 256",
        "n_ubatch = 64",
        "flash_attn = disabled",
        "n_threads = 1 (n_threads_batch = 1)",
    ):
        assert line in said, line


async def test_a_gpu_cells_needle_server_runs_on_the_cuda_build_the_decode_rounds_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The H200 campaign measured no cell: after its CUDA decode rounds, the needle probe asked for the default
    (CPU) build, which the GPU host had never made and began to compile inside the cell's time limit."""
    from daedalus.campaigns.cells import server_build
    from daedalus.engines import paths
    from daedalus.engines.llama_build import CPU, source_hash
    from daedalus.engines.measure import build_config_for

    spec = load_campaign(EXAMPLES / "h200-engine-settings.yaml")
    # as on the H200, whose nvidia-smi reports compute capability 9.0 (this machine has no nvidia-smi to ask)
    cuda = cell_preset(spec, spec.cells()[0], gpus=[0]).model_copy(update={"cuda_architectures": ["90"]})
    config = build_config_for(cuda)
    assert config.backend == "cuda"
    real = paths.default_llama_source()
    cache = tmp_path / "cache"
    source = cache / "src" / f"llama-cpp-python-{paths.EngineSettings().llama_cpp_python_version}" / "vendor"
    source.mkdir(parents=True)
    (source / "llama.cpp").symlink_to(real, target_is_directory=True)
    digest = source_hash(real)
    # Both builds finished (the GPU host compiled the CPU one first, the session before): the needle's server
    # must start from the CUDA one, as the decode rounds' did.
    for key in (config.cache_key(digest), CPU.cache_key(digest)):
        (cache / "llama.cpp" / key / "build" / "bin").mkdir(parents=True)
        (cache / "llama.cpp" / key / "build.json").write_text("{}")
    monkeypatch.setattr(paths, "_configured", paths.EngineSettings(cache_dir=cache))
    build = await server_build(cuda)
    assert build is not None and build.config == config
    assert build.build_dir == cache / "llama.cpp" / config.cache_key(digest) / "build"
