"""The GPU lane's parts that break without a GPU noticing: what `bench/gpu.py` carries and stages, the ticket it
files, and a confined build step that finds the engine build staged before it (each broke on the lent H200)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from daedalus import services
from daedalus.engines.llama_build import BuildConfig, source_hash
from daedalus.engines.measure import build_config_for
from daedalus.engines.paths import default_llama_source
from daedalus.engines.presets import load_preset
from daedalus.hosts.bundle_install import verify
from daedalus.sandbox import Sandbox

REPO = Path(__file__).resolve().parents[2]


def bench_gpu() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "bench" / "gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_ticket_is_a_valid_spec_whose_patch_applies_to_presets_built_for_the_gpus(
    tmp_path: Path,
) -> None:
    gpu = bench_gpu()
    repo = gpu.serving_repo(tmp_path, ["90"])
    spec = services.parse_spec(gpu.ticket_spec(repo, ["90"], 300.0, 0.15), "bench/gpu.py")
    assert spec.build is not None and spec.build.command.startswith(
        "daedalus engine build --backend cuda --cuda-arch 90"
    )
    assert spec.agent is not None and spec.agent.patch
    applied = subprocess.run(
        ["git", "apply"], input=spec.agent.patch, cwd=repo, text=True, capture_output=True
    )
    assert applied.returncode == 0, applied.stderr
    serve = load_preset(repo / "presets" / "serve.yaml")
    assert (serve.cache_type_k, serve.cache_type_v, serve.flash_attn) == ("q8_0", "q8_0", "on")  # type: ignore[union-attr]
    baseline = load_preset(repo / "presets" / "gpu-f16.yaml")
    # The gates' build is the one `stage` made (same cache key), and needs no nvidia-smi in a step's sandbox.
    assert build_config_for(serve, baseline) == BuildConfig("cuda", ("90",))
    assert {g.metric.value for g in spec.gates} == {
        "decode_tps",
        "floor_fraction",
        "temp0_identity",
        "kib_per_token",
    }


def test_staging_keeps_what_an_earlier_call_carried_and_drops_what_the_manifest_no_longer_lists(
    tmp_path: Path,
) -> None:
    gpu = bench_gpu()
    import hashlib

    def entry(path: str, data: bytes) -> dict[str, object]:
        return {"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    files = {
        "wheels/a-1-py3-none-any.whl": b"wheel",
        "debs/bubblewrap_0.8_amd64.deb": b"deb",
        "temporal.xz": b"xz",
    }
    manifest = json.dumps({"python": "3.12", "files": [entry(p, d) for p, d in files.items()]})
    staged = tmp_path / "staged"
    (staged / "wheels").mkdir(parents=True)
    (staged / "wheels" / "old-0-py3-none-any.whl").write_bytes(b"stale")  # from an older bundle
    first, second = tmp_path / "call1", tmp_path / "call2"
    for carried, paths in ((first, ["wheels/a-1-py3-none-any.whl", "debs/bubblewrap_0.8_amd64.deb"]),
                           (second, ["temporal.xz"])):  # fmt: skip
        for path in paths:
            (carried / path).parent.mkdir(parents=True, exist_ok=True)
            (carried / path).write_bytes(files[path])
        (carried / "manifest.json").write_text(manifest)
        gpu.stage_bundle(carried, staged)
    assert sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()) == sorted(
        [*files, "manifest.json"]
    )
    verify(staged)


def test_a_confined_build_step_finds_the_engine_build_staged_before_it(tmp_path: Path) -> None:
    """A ticket's `daedalus engine build` runs in a sandbox where the engine cache is read-only: a finished build
    is found there without the build lock it cannot take (it failed with EROFS on the lock file)."""
    cache = tmp_path / "cache"
    source = cache / "src" / "llama.cpp"
    source.mkdir(parents=True)
    (source / "CMakeLists.txt").write_text("project(fake)\n")
    config = BuildConfig("cuda", ("90",))
    root = cache / "llama.cpp" / config.cache_key(source_hash(source))
    (root / "build" / "bin").mkdir(parents=True)
    for tool in ("llama-server", "llama-perplexity", "llama-bench"):
        (root / "build" / "bin" / tool).write_text("")
    (root / ".lock").write_text("")
    (root / "build.json").write_text(json.dumps({"seconds": 1.0, "flags": list(config.cmake_flags())}))
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    sandbox = Sandbox.for_step(worktree, objects=None, scratch=tmp_path / "scratch", cache=cache)
    command = [str(Path(sys.executable).parent / "daedalus"), "engine", "build", "--backend", "cuda",
               "--cuda-arch", "90", "--source", str(source)]  # fmt: skip
    done = subprocess.run(sandbox.argv(command), env=sandbox.environment("test"), capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(root / "build" / "bin")


@pytest.mark.llama
@pytest.mark.timeout(600)
def test_the_carried_llama_source_holds_every_file_its_build_reads(tmp_path: Path) -> None:
    """`bench/gpu.py pack` carries only part of the llama.cpp tree (the lent machine takes 64 MiB a call): CMake
    configures it, every source file the build names is in it, and the UI-assets step (run even with the UI
    off; its script was left out once and the CUDA build failed at step 264 of 359 on the H200) runs."""
    gpu = bench_gpu()
    source = default_llama_source()
    if not (source / "CMakeLists.txt").is_file():
        pytest.fail(
            f"no llama.cpp source at {source}; run scripts/fetch_llama_cpp.sh (the install step) first"
        )
    tarball = tmp_path / "llama.cpp.tar.xz"
    gpu.pack_source(source, tarball)
    assert tarball.stat().st_size < 12 * 2**20
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    tree = tmp_path / "src" / f"llama-cpp-python-{gpu.LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    build = tmp_path / "build"
    flags = BuildConfig("cpu").cmake_flags()
    configured = subprocess.run(["cmake", "-S", str(tree), "-B", str(build), "-G", "Ninja", *flags],
                                capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert configured.returncode == 0, configured.stdout[-2000:] + configured.stderr[-2000:]
    named = {
        word.rstrip(":|")
        for word in (build / "build.ninja").read_text().split()
        if word.startswith(str(tree))
    }
    missing = sorted(path for path in named if not Path(path).exists())
    assert not missing, missing
    assets = subprocess.run(["cmake", "--build", str(build), "--target", "llama-ui-assets"], capture_output=True,
                            text=True, timeout=300, check=False)  # fmt: skip
    assert assets.returncode == 0, assets.stdout[-2000:]
