"""A vLLM fork built at the agent's commit (issue 31 item 6; the seed's 6b, 6d and 6e had no build, so their gates
measured whatever vLLM the host had): a ticket's build (`daedalus engine overlay`) installs the engine repo at the
attempt's commit over the engine environment, inside the attempt's checkout, and its gates then run vLLM with it.

Real parts: a git repo standing in for the fork, whose Python-only change is a `vllm.general_plugins` package; the
build and the gate run confined (bubblewrap) through the host's own build and gate activities; the gate starts
vLLM's CPU build. The fork's change is the seed's kind of change, a default the team's fork sets differently (here
the CPU KV cache it reserves), so the gate's figure moves with the agent's commit and with nothing else.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment
from tests.ticket_helpers import commit_all

from daedalus.activities.builds import BuildActivities
from daedalus.activities.confined import ConfinedSteps
from daedalus.activities.gates import GateActivities
from daedalus.activities.workspace import Workspace
from daedalus.agents import worktree as wt
from daedalus.confinement import StepSettings
from daedalus.engines.paths import cache_root
from daedalus.engines.presets import SHIPPED_PRESET_DIR
from daedalus.engines.vllm_env import VllmEnvironment, installed_environment
from daedalus.engines.vllm_overlay import OVERLAY_DIR, build_overlay, find_overlay
from daedalus.errors import EngineSetupError
from daedalus.schemas.gates import GateResult, GateSpec, Verdict
from daedalus.schemas.steps import BuildInput, BuildResult, GateInput, ResourceLimits

BASE_POOL = 524_288  # 1 GiB (VLLM_CPU_KVCACHE_SPACE=1) over tiny-llama's 2 KiB of KV per token
PLUGIN = '''"""The fork's KV reservation: the CPU KV cache is the preset's space times FACTOR."""

FACTOR = {factor}


def register() -> None:
    from vllm.platforms.cpu import CpuPlatform

    if FACTOR == 1 or getattr(CpuPlatform, "_kv_reserve", False):
        return
    original = CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        original(cls, vllm_config)
        cache = vllm_config.cache_config
        if cache.kv_cache_memory_bytes:
            cache.kv_cache_memory_bytes = int(cache.kv_cache_memory_bytes * FACTOR)

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    CpuPlatform._kv_reserve = True
'''
PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "kv-reserve"
version = "0.1.0"

[project.entry-points."vllm.general_plugins"]
kv_reserve = "kv_reserve:register"

[tool.setuptools]
packages = ["kv_reserve"]
"""


def fork_repo(path: Path) -> tuple[Path, str, str]:
    """The fork at its base (the plugin reserves the preset's space) and the agent's commit (twice that)."""
    (path / "kv_reserve").mkdir(parents=True)
    (path / "presets").mkdir()
    (path / "pyproject.toml").write_text(PYPROJECT)
    (path / "kv_reserve" / "__init__.py").write_text(PLUGIN.format(factor=1))
    (path / "presets" / "serve.yaml").write_text((SHIPPED_PRESET_DIR / "vllm-cpu-ar.yaml").read_text())
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True)
    commit_all(path, "base")
    base = wt.in_repo(path, "rev-parse", "HEAD").strip()
    (path / "kv_reserve" / "__init__.py").write_text(PLUGIN.format(factor=2))
    commit_all(path, "reserve twice the KV space")
    return path, base, wt.in_repo(path, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def vllm_environment() -> VllmEnvironment:
    try:
        return installed_environment()
    except EngineSetupError as error:
        pytest.fail(f"{error} (the vLLM tests run vLLM's CPU build for real; `make test` installs it)")


async def build_and_gate(
    steps: ConfinedSteps, attempt: int, gate: GateSpec
) -> tuple[BuildResult, GateResult]:
    """The ticket's build at the attempt's checkout, then its gate, as the host's worker runs them."""
    build = await ActivityEnvironment().run(
        BuildActivities(steps).run_build,
        BuildInput(ticket_id="fork", attempt=attempt, command="daedalus engine overlay", timeout_s=300),
    )
    assert build.ok, build.log_tail
    result = await ActivityEnvironment().run(
        GateActivities(steps).run_gate,
        GateInput(ticket_id="fork", attempt=attempt, gate=gate, host="local", startup_s=900),
    )
    return build, result


@pytest.mark.timeout(900)
async def test_seed_fork_change_at_the_agents_commit_changes_the_gates_result(
    tmp_path: Path, vllm_environment: VllmEnvironment
) -> None:
    repo, base, change = fork_repo(tmp_path / "fork")
    workspace = Workspace(root=tmp_path / "ws", artifacts=tmp_path / "artifacts")
    for attempt, commit in ((1, base), (2, change)):
        workspace._record_checkout("fork", attempt, repo)
        wt.prepare_worktree(repo=repo, base_commit=commit, worktree=workspace.worktree("fork", attempt),
                            branch=wt.branch_name("fork", attempt))  # fmt: skip
    steps = ConfinedSteps(workspace, StepSettings(), ResourceLimits())
    # The ticket's claim: the fork reserves at least 1.5x the preset's KV space. 60 s of measuring: the vLLM start
    # is timed apart (startup_s), so a start of a minute or more does not end the gate.
    gate = GateSpec.model_validate({
        "name": "kv-reserved", "metric": "kv_pool_tokens", "threshold": BASE_POOL * 1.5, "timeout_s": 60,
        "command": "daedalus engine measure kv_pool_tokens --preset presets/serve.yaml --model tiny-llama",
    })  # fmt: skip
    (_, at_base), (_, at_change) = await asyncio.gather(
        build_and_gate(steps, 1, gate), build_and_gate(steps, 2, gate)
    )
    assert at_base.verdict is Verdict.FAIL, at_base.reason
    assert at_base.samples == [float(BASE_POOL)]
    assert at_change.verdict is Verdict.PASS, at_change.reason
    assert at_change.samples == [float(2 * BASE_POOL)]
    # Each verdict names the build it measured: the environment, and the overlay of the repo at its commit.
    for attempt, result, commit in ((1, at_base, base), (2, at_change, change)):
        assert result.provenance is not None
        assert f"overlay of {workspace.worktree('fork', attempt)}" in result.provenance.engine_build
        assert f"at {commit[:12]} (plugins kv_reserve)" in result.provenance.engine_build
        assert str(vllm_environment.root) in result.provenance.engine_build
        assert float(result.evidence["engine_startup_s"].split()[0]) > 0
    # The overlay lives in each attempt's checkout; the shared environment holds no trace of the plugin.
    for attempt in (1, 2):
        assert (workspace.worktree("fork", attempt) / OVERLAY_DIR / "site" / "kv_reserve").is_dir()
    assert not list((cache_root() / "vllm").glob("*/lib/python*/site-packages/kv_reserve*"))


def test_an_overlay_built_at_another_commit_or_committed_by_the_agent_is_refused(
    tmp_path: Path, vllm_environment: VllmEnvironment
) -> None:
    repo, _, _ = fork_repo(tmp_path / "fork")
    built = build_overlay(repo, vllm_environment)
    assert built.stamp.plugins == ["kv_reserve"] and built.stamp.fork_files == 0
    found = find_overlay(repo)
    assert found is not None and found.stamp.commit == built.stamp.commit
    # The agent commits the overlay (stamp and all): its stamp names the commit before, never its own.
    commit_all(repo, "an overlay of my own")
    with pytest.raises(
        EngineSetupError, match=r"was built at .*, the checkout is at .*run the ticket's build"
    ):
        find_overlay(repo)
    # The build replaces it with one of the checkout as it is.
    assert build_overlay(repo, vllm_environment).stamp.commit == wt.in_repo(repo, "rev-parse", "HEAD").strip()
    with pytest.raises(EngineSetupError, match="strict overlay boots vLLM from the repo's own Python tree"):
        build_overlay(repo, vllm_environment, strict=True)


# Four modules vLLM's OpenAI server imports as it starts: the seed's "four files that had drifted in site-packages".
DRIFTED = (
    "vllm/sampling_params.py",
    "vllm/v1/outputs.py",
    "vllm/config/scheduler.py",
    "vllm/engine/arg_utils.py",
)


@pytest.mark.timeout(600)
def test_seed_6b_strict_pure_repo_boot_fails_while_files_live_only_in_site_packages(
    tmp_path: Path, vllm_environment: VllmEnvironment
) -> None:
    """The seed's 6b: four files had drifted into site-packages, so the fork booted from a mix of its repo and the
    host's install. A strict overlay lays only the repo's Python over the installed package's compiled parts: at the
    base the server's import fails on a drifted module; once they are synced back, it imports from the repo alone
    (and a plain overlay would have hidden the drift, by linking the host's copies)."""
    [installed] = vllm_environment.root.glob("lib/python*/site-packages/vllm")
    repo = tmp_path / "fork"
    for source in installed.rglob("*.py"):
        relative = source.relative_to(installed.parent)
        if "__pycache__" in relative.parts or str(relative) in DRIFTED:
            continue
        (repo / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, repo / relative)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    commit_all(repo, "the fork, four files short")
    with pytest.raises(
        EngineSetupError, match=r"(?s)does not import from the repo's tree alone.*No module named 'vllm\."
    ):
        build_overlay(repo, vllm_environment, strict=True)
    lenient = build_overlay(repo, vllm_environment)  # the drift hidden: site-packages fills the gap
    assert lenient.stamp.fork_files > 2000 and not lenient.stamp.strict
    for drifted in DRIFTED:
        shutil.copyfile(installed.parent / drifted, repo / drifted)
    commit_all(repo, "sync the four drifted files back into the repo")
    strict = build_overlay(repo, vllm_environment, strict=True)
    assert strict.stamp.strict and strict.stamp.vllm_file.startswith(str(repo / OVERLAY_DIR / "site"))
    site_vllm = repo / OVERLAY_DIR / "site" / "vllm"
    assert all((site_vllm.parent / d).is_file() and not (site_vllm.parent / d).is_symlink() for d in DRIFTED)
    assert not any(p.is_symlink() for p in site_vllm.rglob("*.py")), "a Python file came from site-packages"
