"""Every import in the package points down the layers, and no siblings import each other in a circle.

The contracts are in pyproject.toml ([tool.importlinter]): cli -> stack -> api -> services -> worker -> workflows
-> activities -> config -> the domain packages -> schemas | errors -> ids, every top-level module placed
(`exhaustive`), and an acyclic-siblings contract over the whole package. The ignored imports there are the known
violations still to fix: one that no longer exists fails the run (import-linter's default), so the lists only
shrink.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache", "--no-logo"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def contracts() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    return found


def test_imports_point_down_the_layers_with_no_cycles() -> None:
    run = lint(PYPROJECT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 2 kept, 0 broken." in run.stdout, run.stdout


def without_ignores(contract: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over pyproject.toml with `contract`'s ignore list emptied."""
    text = PYPROJECT.read_text()
    begin = text.index("ignore_imports = [", text.index(f'id = "{contract}"'))
    end = text.index("\n]\n", begin) + 2
    config = tmp_path / f"{contract}.toml"
    config.write_text(text[:begin] + "ignore_imports = []" + text[end:])
    return lint(config)


def test_each_ignored_import_runs_up_the_layers(tmp_path: Path) -> None:
    """Without its ignore list the layers contract is broken, naming every import on that list: the check can
    fail, and nothing is ignored that is not a violation."""
    run = without_ignores("layers", tmp_path)
    assert run.returncode != 0, run.stdout
    report = " ".join(run.stdout.split())
    for line in next(c for c in contracts() if c["id"] == "layers")["ignore_imports"]:
        importer, imported = (part.strip() for part in line.split("->"))
        assert f"{importer} -> {imported}" in report, (line, run.stdout)


def test_the_ignored_imports_close_cycles(tmp_path: Path) -> None:
    """Without its ignore list the acyclic contract is broken (which imports it would cut is its heuristic)."""
    run = without_ignores("acyclic", tmp_path)
    assert run.returncode != 0 and "No cycles are allowed in daedalus" in run.stdout, run.stdout


def test_every_top_level_module_has_a_layer() -> None:
    """`exhaustive`: a new module under src/daedalus must be placed in the layers before it lands."""
    layers = next(c for c in contracts() if c["id"] == "layers")
    assert layers["exhaustive"] is True
    placed = {name.strip("() ") for layer in layers["layers"] for name in layer.replace("|", ":").split(":")}
    package = ROOT / "src" / "daedalus"
    present = {
        p.stem if p.is_file() else p.name
        for p in package.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").is_file())
    }
    assert present <= placed, sorted(present - placed)
