"""Engine fixtures: the llama.cpp build (built once into the shared cache, then reused) and tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest

from daedalus.engines.llama_build import LlamaBuild, build_llama_cpp, cached_build
from daedalus.engines.paths import default_llama_source
from daedalus.engines.tiny_model import ensure_model


@pytest.fixture(scope="session")
async def llama_build() -> LlamaBuild:
    source = default_llama_source()
    if not (source / "CMakeLists.txt").is_file():
        pytest.fail(
            f"no llama.cpp source at {source}; run scripts/fetch_llama_cpp.sh (the install step) first"
        )
    return cached_build(source) or await build_llama_cpp(source)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return ensure_model("tiny")


@pytest.fixture(scope="session")
def small_model() -> Path:
    return ensure_model("small")
