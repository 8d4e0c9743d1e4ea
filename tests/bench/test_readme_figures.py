"""The README's benchmark figures are the committed reference runs' (bench/figures.py), and nothing else."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import figures  # noqa: E402


def test_every_reference_run_has_a_renderer_and_every_renderer_its_run() -> None:
    found = figures.references()
    assert found, "bench/reference/ holds no run"
    missing = set(figures.RENDERERS) - set(found) - figures.NEEDS_A_GPU
    assert set(found) <= set(figures.RENDERERS) and not missing, (
        f"reference files without a renderer: {sorted(set(found) - set(figures.RENDERERS))}; "
        f"renderers without their reference file: {sorted(missing)}"
    )
    for name, figures_of_run in found.items():
        sha, conditions = figures.provenance(figures_of_run)
        assert sha, f"{name}: made at no known commit ({conditions})"
        assert "cores" in conditions or "lent host" in conditions, (
            f"{name}: its run's conditions: {conditions}"
        )


def test_the_readme_table_is_the_one_the_reference_runs_make() -> None:
    readme = (ROOT / "README.md").read_text()
    assert figures.readme_block(readme) == figures.table(figures.references()), (
        "README.md's benchmark table differs from bench/reference/: run `.venv/bin/python bench/figures.py --write`"
    )
