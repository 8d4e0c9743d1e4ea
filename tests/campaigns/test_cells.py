"""A cell the worker cannot run (no llama.cpp source or build here) is INVALID with what to fix, never CRASHED:
a crash is read as the preset's wall, and a worker's missing setup must not look like one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from daedalus.campaigns.cells import measure_cell
from daedalus.campaigns.spec import load_campaign
from daedalus.config import Settings
from daedalus.engines import paths
from daedalus.schemas.campaigns import CellOutcome

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "campaigns"


@pytest.fixture
def empty_engine_cache(tmp_path: Path) -> Iterator[Path]:
    """This process's engine cache points at an empty directory for the test, then back."""
    configured = Settings.load().engines
    paths.configure(configured.model_copy(update={"cache_dir": tmp_path / "cache"}))
    try:
        yield tmp_path / "cache"
    finally:
        paths.configure(configured)


async def test_a_worker_without_the_engine_gives_invalid_cells_that_say_what_to_fix(
    empty_engine_cache: Path, tmp_path: Path
) -> None:
    spec = load_campaign(EXAMPLES / "local-kv-matrix.yaml")
    result = await measure_cell(spec, spec.cells()[0], tmp_path / "cell")
    assert result.outcome is CellOutcome.INVALID, result
    assert "cannot run the cell" in result.detail and "fetch_llama_cpp.sh" in result.detail
