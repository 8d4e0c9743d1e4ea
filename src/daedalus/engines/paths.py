"""Where engine builds, fetched sources and generated models are cached."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def cache_root() -> Path:
    """`$DAEDALUS_CACHE_DIR`, or `<repo>/.cache` (git-ignored)."""
    env = os.environ.get("DAEDALUS_CACHE_DIR")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / ".cache"


def default_llama_source() -> Path:
    """The tree `scripts/fetch_llama_cpp.sh` unpacks (the llama-cpp-python sdist's vendored llama.cpp)."""
    version = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
    return cache_root() / "src" / f"llama-cpp-python-{version}" / "vendor" / "llama.cpp"
