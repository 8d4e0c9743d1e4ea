"""Build llama.cpp from a source tree with CMake, once per source hash and backend flags, cached and shared.

The CPU build is the default and keeps its cache key (the source hash alone). A CUDA build adds
`-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=...` and lives under `<hash>-cuda-<flags hash>`, so two architecture
lists never share a build and a CPU build is never mistaken for a GPU one.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from daedalus.engines.engine_processes import run_teed
from daedalus.engines.paths import cache_root
from daedalus.errors import BuildError, EngineError, EngineSetupError
from daedalus.processes import log_tail

log = structlog.get_logger(__name__)

TARGETS = ("llama-server", "llama-perplexity", "llama-bench")
# Offline, CPU-only, static: no curl/openssl, and no Web UI (its prebuilt assets would be downloaded).
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_CCACHE=OFF",
)
_NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")
_SKIP_DIRS = {".git", "build", "__pycache__"}


Backend = Literal["cpu", "cuda"]
BACKENDS: tuple[Backend, ...] = ("cpu", "cuda")
_ARCH = re.compile(r"^\d{2,3}[a-z]?(-real|-virtual)?$")


def parse_compute_caps(text: str) -> tuple[str, ...]:
    """`nvidia-smi --query-gpu=compute_cap --format=csv,noheader` ("9.0" a line) as CMake architectures ("90")."""
    archs: list[str] = []
    for line in text.split():
        major, dot, minor = line.strip().partition(".")
        if not (dot and major.isdigit() and minor.isdigit()):
            raise BuildError(f"nvidia-smi reported compute capability {line!r}, expected a number like 9.0")
        arch = f"{major}{minor}"
        if arch not in archs:
            archs.append(arch)
    return tuple(archs)


def detect_cuda_architectures() -> tuple[str, ...]:
    """The compute capabilities of this host's GPUs, from nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise BuildError(
            "a CUDA build needs the GPUs' architectures: nvidia-smi is not on PATH here, so pass them "
            "(--cuda-arch 90 for an H100/H200) or set cuda_architectures in the preset"
        )
    done = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    if done.returncode != 0 or not done.stdout.strip():
        raise BuildError(f"nvidia-smi could not report compute capabilities (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()[:300]}; pass --cuda-arch instead")  # fmt: skip
    return parse_compute_caps(done.stdout)


@dataclass(frozen=True)
class BuildConfig:
    """Which backend to build and, for CUDA, for which architectures."""

    backend: Backend = "cpu"
    cuda_architectures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise BuildError(f"unknown backend {self.backend!r}; known: {', '.join(BACKENDS)}")
        if self.backend == "cpu" and self.cuda_architectures:
            raise BuildError(
                "CUDA architectures were given for a CPU build; pass --backend cuda or drop them"
            )
        for arch in self.cuda_architectures:
            if not _ARCH.match(arch):
                raise BuildError(f"CUDA architecture {arch!r} is not like 90, 90a or 89-real (CMake's form)")

    @classmethod
    def for_backend(cls, backend: Backend, architectures: Sequence[str] = ()) -> BuildConfig:
        """A config; a CUDA build with no architectures asks nvidia-smi."""
        if backend == "cuda" and not architectures:
            architectures = detect_cuda_architectures()
        return cls(backend=backend, cuda_architectures=tuple(architectures))

    def cmake_flags(self) -> tuple[str, ...]:
        if self.backend == "cpu":
            return CMAKE_FLAGS
        if not self.cuda_architectures:
            raise BuildError("a CUDA build needs at least one architecture; use BuildConfig.for_backend")
        return (
            *CMAKE_FLAGS,
            "-DGGML_CUDA=ON",
            f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(self.cuda_architectures)}",
        )

    def cache_key(self, digest: str) -> str:
        if self.backend == "cpu":
            return digest  # unchanged, so every CPU build made before backends existed is still found
        flags = hashlib.sha256("\0".join(self.cmake_flags()).encode()).hexdigest()[:8]
        return f"{digest}-{self.backend}-{flags}"


CPU = BuildConfig()


def find_nvcc() -> str:
    """nvcc on PATH, or the toolkit's default place (images often leave /usr/local/cuda/bin off PATH)."""
    toolkit = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    for candidate in (shutil.which("nvcc"), os.environ.get("CUDACXX"), str(toolkit)):
        if candidate and Path(candidate).is_file():
            return candidate
    raise BuildError(
        "a CUDA build needs nvcc (the CUDA toolkit): put it on PATH, or set CUDACXX or CUDA_HOME"
    )


@dataclass(frozen=True)
class LlamaBuild:
    source: Path
    source_hash: str
    build_dir: Path
    config: BuildConfig = CPU

    @property
    def bin_dir(self) -> Path:
        return self.build_dir / "bin"

    def binary(self, name: str) -> Path:
        path = self.bin_dir / name
        if not path.is_file():
            raise EngineError(
                f"{name} is not in the build at {self.bin_dir}; rebuild with `daedalus engine build`"
            )
        return path


def source_hash(source: Path) -> str:
    """sha256 over every file's relative path and content, so any edit to the tree is a new build."""
    if not (source / "CMakeLists.txt").is_file():
        raise EngineSetupError(
            f"{source} is not a llama.cpp source tree (no CMakeLists.txt); run scripts/fetch_llama_cpp.sh "
            "or pass --source pointing at a llama.cpp checkout"
        )
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(files):
            path = Path(root) / name
            if path.is_symlink():
                continue
            digest.update(str(path.relative_to(source)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def build_root(digest: str) -> Path:
    return cache_root() / "llama.cpp" / digest


def cached_build(source: Path, config: BuildConfig = CPU) -> LlamaBuild | None:
    """The finished build for this source tree and config, or None."""
    digest = source_hash(source)
    root = build_root(config.cache_key(digest))
    if (root / "build.json").is_file():
        return LlamaBuild(source=source, source_hash=digest, build_dir=root / "build", config=config)
    return None


async def build_llama_cpp(
    source: Path,
    *,
    jobs: int = 2,
    on_progress: Callable[[int, int, str], None] | None = None,
    config: BuildConfig = CPU,
) -> LlamaBuild:
    """Configure and build the three tools; reuse a finished build of the same source hash.

    A file lock serialises concurrent builders (other test sessions); a `build.json` marker written last
    means a half-finished build is never mistaken for a finished one.
    """
    source = source.resolve()
    digest = await asyncio.to_thread(source_hash, source)
    flags = config.cmake_flags()
    root = build_root(config.cache_key(digest))
    root.mkdir(parents=True, exist_ok=True)
    marker = root / "build.json"
    build_dir = root / "build"
    result = LlamaBuild(source=source, source_hash=digest, build_dir=build_dir, config=config)
    if marker.is_file():
        # Finished builds never change: no lock, which a confined step could not take (the cache is read-only
        # there, daedalus.sandbox).
        return result
    lock_fd = os.open(root / ".lock", os.O_CREAT | os.O_RDWR)
    try:
        await asyncio.to_thread(fcntl.flock, lock_fd, fcntl.LOCK_EX)
        if marker.is_file():
            return result
        build_log = root / "build.log"
        build_log.unlink(missing_ok=True)
        if shutil.which("cmake") is None:
            raise BuildError("cmake is not on PATH; install cmake (and a C++ compiler) to build llama.cpp")
        configure_extra = []
        if config.backend == "cuda":
            configure_extra = [f"-DCMAKE_CUDA_COMPILER={find_nvcc()}"]
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        started = time.monotonic()
        configure = ["cmake", "-S", str(source), "-B", str(build_dir), *generator, *flags, *configure_extra]
        rc = await run_teed(configure, build_log)
        if rc != 0:
            raise BuildError(
                f"cmake configure failed (exit {rc}); last lines of {build_log}:\n{log_tail(build_log, lines=30, missing='(no log written)')}"
            )

        def progress(line: str) -> None:
            m = _NINJA_PROGRESS.match(line)
            if m and on_progress is not None:
                on_progress(int(m.group(1)), int(m.group(2)), line)

        compile_cmd = ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS]
        rc = await run_teed(compile_cmd, build_log, on_line=progress)
        if rc != 0:
            raise BuildError(
                f"cmake build failed (exit {rc}); last lines of {build_log}:\n{log_tail(build_log, lines=30, missing='(no log written)')}"
            )
        for name in TARGETS:
            result.binary(name)
        info = {
            "source": str(source),
            "source_hash": digest,
            "targets": list(TARGETS),
            "backend": config.backend,
            "flags": list(flags),
            "seconds": round(time.monotonic() - started, 1),
        }
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        tmp.rename(marker)
        log.info("llama_cpp.built", **info)
        return result
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
