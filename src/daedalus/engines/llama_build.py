"""Build llama.cpp from a source tree with CMake, once per source hash, cached and shared by processes."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from daedalus.engines.paths import cache_root
from daedalus.engines.process import run_logged, tail
from daedalus.errors import BuildError, EngineError

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


@dataclass(frozen=True)
class LlamaBuild:
    source: Path
    source_hash: str
    build_dir: Path

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
        raise EngineError(
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


def cached_build(source: Path) -> LlamaBuild | None:
    """The finished build for this source tree, or None."""
    digest = source_hash(source)
    root = build_root(digest)
    if (root / "build.json").is_file():
        return LlamaBuild(source=source, source_hash=digest, build_dir=root / "build")
    return None


async def build_llama_cpp(
    source: Path,
    *,
    jobs: int = 2,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> LlamaBuild:
    """Configure and build the three tools; reuse a finished build of the same source hash.

    A file lock serialises concurrent builders (other test sessions); a `build.json` marker written last
    means a half-finished build is never mistaken for a finished one.
    """
    source = source.resolve()
    digest = await asyncio.to_thread(source_hash, source)
    root = build_root(digest)
    root.mkdir(parents=True, exist_ok=True)
    marker = root / "build.json"
    build_dir = root / "build"
    result = LlamaBuild(source=source, source_hash=digest, build_dir=build_dir)
    lock_fd = os.open(root / ".lock", os.O_CREAT | os.O_RDWR)
    try:
        await asyncio.to_thread(fcntl.flock, lock_fd, fcntl.LOCK_EX)
        if marker.is_file():
            return result
        build_log = root / "build.log"
        build_log.unlink(missing_ok=True)
        if shutil.which("cmake") is None:
            raise BuildError("cmake is not on PATH; install cmake (and a C++ compiler) to build llama.cpp")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        started = time.monotonic()
        configure = ["cmake", "-S", str(source), "-B", str(build_dir), *generator, *CMAKE_FLAGS]
        rc = await run_logged(configure, build_log)
        if rc != 0:
            raise BuildError(
                f"cmake configure failed (exit {rc}); last lines of {build_log}:\n{tail(build_log)}"
            )

        def progress(line: str) -> None:
            m = _NINJA_PROGRESS.match(line)
            if m and on_progress is not None:
                on_progress(int(m.group(1)), int(m.group(2)), line)

        compile_cmd = ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS]
        rc = await run_logged(compile_cmd, build_log, on_line=progress)
        if rc != 0:
            raise BuildError(f"cmake build failed (exit {rc}); last lines of {build_log}:\n{tail(build_log)}")
        for name in TARGETS:
            result.binary(name)
        info = {
            "source": str(source),
            "source_hash": digest,
            "targets": list(TARGETS),
            "flags": list(CMAKE_FLAGS),
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
