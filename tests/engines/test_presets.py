from pathlib import Path

import pytest

from daedalus.engines.presets import PRESET_DIR, load_preset, parse_preset
from daedalus.errors import PresetError
from daedalus.schemas.engines import LlamaCppPreset, VllmPreset


def test_every_example_preset_loads() -> None:
    names = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
    assert {"local-f16", "local-q8_0", "local-spec-self", "vllm-pool-tbq4nc", "llama-turbo3-full3bit"} <= set(
        names
    )
    for name in names:
        preset = load_preset(name)
        assert preset.name == name


def test_seed_presets_say_what_the_seed_says() -> None:
    pool = load_preset("vllm-pool-tbq4nc")
    assert isinstance(pool, VllmPreset)
    assert (pool.kv_cache_dtype, pool.max_model_len, pool.enable_prefix_caching) == (
        "tq_4bit_nc",
        16384,
        False,
    )
    assert pool.additional_config == {"tq_num_splits": 96}
    turbo = load_preset("llama-turbo3-full3bit")
    assert isinstance(turbo, LlamaCppPreset)
    assert (turbo.cache_type_k, turbo.cache_type_v, turbo.env) == (
        "turbo3",
        "turbo3",
        {"TURBO_AUTO_ASYMMETRIC": "0"},
    )


def test_unknown_field_is_named() -> None:
    with pytest.raises(PresetError, match=r"unknown field 'ctx_size'"):
        parse_preset({"engine": "llama.cpp", "name": "x", "ctx_size": 4096})


def test_unknown_value_is_named_with_the_known_ones() -> None:
    with pytest.raises(PresetError, match=r"field 'kv_cache_dtype'.*tbq9.*known: auto"):
        parse_preset({"engine": "vllm", "name": "x", "max_model_len": 4096, "kv_cache_dtype": "tbq9"})
    with pytest.raises(PresetError, match=r"field 'cache_type_k'"):
        parse_preset({"engine": "llama.cpp", "name": "x", "cache_type_k": "q9_9"})


def test_missing_engine_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(PresetError, match="'engine' is required"):
        parse_preset({"name": "x"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: [unclosed\n")
    with pytest.raises(PresetError, match="not valid YAML"):
        load_preset(bad)
    with pytest.raises(PresetError, match=r"no preset named 'nope'.*known: .*local-f16"):
        load_preset("nope")


def test_quantized_v_without_flash_attention_is_rejected() -> None:
    with pytest.raises(PresetError, match="needs flash_attn"):
        parse_preset({"engine": "llama.cpp", "name": "x", "cache_type_v": "q8_0", "flash_attn": "off"})
