"""CUDA builds, tested on the CPU: architectures, CMake flags, cache keys, and the errors a CPU host gives."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from daedalus.cli import app
from daedalus.engines import paths
from daedalus.engines.llama_build import (
    CMAKE_FLAGS,
    CPU,
    BuildConfig,
    BuildError,
    LlamaBuild,
    build_llama_cpp,
    build_root,
    cached_build,
    detect_cuda_architectures,
    parse_compute_caps,
    source_hash,
)
from daedalus.engines.llama_cpp import LlamaCppAdapter
from daedalus.engines.measure import build_config_for
from daedalus.engines.presets import PresetError, load_preset, parse_preset
from daedalus.errors import EngineError

GPU_PRESET = {"engine": "llama.cpp", "name": "g", "backend": "cuda", "n_gpu_layers": 999}


def fake_tool(bin_dir: Path, name: str, output: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\nprintf '{output}'\n")
    tool.chmod(0o755)


def test_compute_capabilities_become_cmake_architectures() -> None:
    assert parse_compute_caps("9.0\n9.0\n9.0\n9.0\n") == ("90",)
    assert parse_compute_caps("8.6\n9.0\n") == ("86", "90")
    with pytest.raises(BuildError, match="compute capability '\\[N/A\\]'"):
        parse_compute_caps("[N/A]\n")


def test_cpu_build_keeps_its_flags_and_its_cache_key() -> None:
    assert CPU.cmake_flags() == CMAKE_FLAGS
    assert CPU.cache_key("abc") == "abc"  # builds made before backends existed are still found


def test_cuda_flags_and_keys_follow_the_architectures() -> None:
    h200 = BuildConfig(backend="cuda", cuda_architectures=("90",))
    both = BuildConfig(backend="cuda", cuda_architectures=("86", "90"))
    assert h200.cmake_flags()[-2:] == ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90")
    assert both.cmake_flags()[-1] == "-DCMAKE_CUDA_ARCHITECTURES=86;90"
    keys = {CPU.cache_key("abc"), h200.cache_key("abc"), both.cache_key("abc")}
    assert len(keys) == 3 and h200.cache_key("abc").startswith("abc-cuda-")
    assert h200.cache_key("abc") == BuildConfig("cuda", ("90",)).cache_key("abc")  # stable across processes


@pytest.mark.parametrize(
    ("backend", "archs", "words"),
    [("cpu", ("90",), "CUDA architectures were given for a CPU build"),
     ("cuda", ("sm_90",), "not like 90"), ("rocm", (), "unknown backend")],
)  # fmt: skip
def test_bad_build_configs_say_what_to_change(backend: str, archs: tuple[str, ...], words: str) -> None:
    with pytest.raises(BuildError, match=words):
        BuildConfig(backend=backend, cuda_architectures=archs)  # type: ignore[arg-type]


def test_architectures_come_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path / "bin", "nvidia-smi", "9.0\\n9.0\\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert detect_cuda_architectures() == ("90",)
    assert BuildConfig.for_backend("cuda").cuda_architectures == ("90",)
    assert BuildConfig.for_backend("cuda", ["89"]).cuda_architectures == ("89",)  # an explicit list wins


def test_a_cpu_host_without_nvidia_smi_asks_for_the_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BuildError, match=r"nvidia-smi is not on PATH.*--cuda-arch 90"):
        BuildConfig.for_backend("cuda")
    result = CliRunner().invoke(app, ["engine", "build", "--backend", "cuda"])
    assert result.exit_code == 2 and "--cuda-arch" in result.output
    result = CliRunner().invoke(app, ["engine", "build", "--backend", "metal"])
    assert result.exit_code == 2 and "unknown backend 'metal'" in result.output


def test_a_cuda_build_without_nvcc_fails_before_cmake_and_leaves_no_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("project(x)\n")
    monkeypatch.setattr(paths, "_configured", paths.EngineSettings(cache_dir=tmp_path / "cache"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-toolkit"))
    monkeypatch.delenv("CUDACXX", raising=False)
    config = BuildConfig(backend="cuda", cuda_architectures=("90",))
    with pytest.raises(BuildError, match="needs nvcc"):
        asyncio.run(build_llama_cpp(source, config=config))
    assert cached_build(source, config) is None
    assert not (build_root(config.cache_key(source_hash(source))) / "build.json").exists()


def test_a_cpu_build_is_never_taken_for_a_cuda_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("project(x)\n")
    monkeypatch.setattr(paths, "_configured", paths.EngineSettings(cache_dir=tmp_path / "cache"))
    root = build_root(CPU.cache_key(source_hash(source)))
    root.mkdir(parents=True)
    (root / "build.json").write_text("{}")
    found = cached_build(source, CPU)
    assert found is not None and found.config == CPU
    assert cached_build(source, BuildConfig(backend="cuda", cuda_architectures=("90",))) is None


def test_gpu_presets_validate_and_pick_the_cuda_build() -> None:
    presets = [load_preset(n) for n in ("gpu-f16", "gpu-f16-nofa", "gpu-q8_0")]
    assert all(p.backend == "cuda" and p.n_gpu_layers > 0 for p in presets)  # type: ignore[union-attr]
    assert {p.flash_attn for p in presets} == {"on", "off"}  # type: ignore[union-attr]
    assert build_config_for(parse_preset({**GPU_PRESET, "cuda_architectures": ["90"]})) == BuildConfig(
        "cuda", ("90",)
    )
    assert build_config_for(load_preset("local-f16")) == CPU
    with pytest.raises(EngineError, match="mix backends"):
        build_config_for(load_preset("local-f16"), parse_preset({**GPU_PRESET, "cuda_architectures": ["90"]}))


@pytest.mark.parametrize(
    ("fields", "words"),
    [({"n_gpu_layers": 0}, "would run on the CPU"),
     ({"backend": "cpu", "cuda_architectures": ["90"]}, "backend is 'cpu'")],
)  # fmt: skip
def test_inconsistent_gpu_presets_are_refused(fields: dict[str, object], words: str) -> None:
    with pytest.raises(PresetError, match=words):
        parse_preset({**GPU_PRESET, **fields})


def test_a_gpu_preset_launches_with_every_layer_offloaded(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").write_text("")
    build = LlamaBuild(source=tmp_path, source_hash="x", build_dir=tmp_path,
                       config=BuildConfig("cuda", ("90",)))  # fmt: skip
    preset = load_preset("gpu-q8_0")
    argv = LlamaCppAdapter(build, preset).command(tmp_path / "m.gguf", 8080)  # type: ignore[arg-type]

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert value("--n-gpu-layers") == "999" and value("--flash-attn") == "on"
    assert value("--cache-type-k") == "q8_0" and value("--cache-type-v") == "q8_0"
