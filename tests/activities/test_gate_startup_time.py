"""A gate's engine start-ups are timed apart from its measuring (issue 31, item 2): `timeout_s` is measuring time,
the starts the command records on its start-up clock are bounded by their own limits and the gate's
`startup_timeout_s`. Real bubblewrap: the command writes the clock inside its sandbox, the worker reads it outside.

The stand-in command sleeps where vLLM would start (a real vLLM start runs confined under the same clock in
tests/engines/test_vllm_engine.py and in the seed ticket 4 test).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from daedalus.activities.confined import ConfinedSteps
from daedalus.activities.gates import GateActivities
from daedalus.activities.workspace import Workspace
from daedalus.agents import worktree as wt
from daedalus.confinement import StepSettings
from daedalus.engines.startup_clock import Start, read_starts, startup_seconds
from daedalus.schemas.gates import GateResult, GateSpec, Verdict
from daedalus.schemas.steps import GateInput, ResourceLimits
from tests.support import FIXTURES, make_engine_repo

SLOW_START = FIXTURES / "slow_start_gate.py"
TIMEOUT_S = 8


@pytest.fixture
def steps(tmp_path: Path) -> ConfinedSteps:
    workspace = Workspace(root=tmp_path / "ws", artifacts=tmp_path / "artifacts")
    repo = make_engine_repo(tmp_path / "engine")
    workspace._record_checkout("t1", 1, repo)
    wt.prepare_worktree(
        repo=repo, base_commit="main", worktree=workspace.worktree("t1", 1), branch=wt.branch_name("t1", 1)
    )
    return ConfinedSteps(workspace, StepSettings(read_only=[FIXTURES]), ResourceLimits(processes=64))


async def gate(steps: ConfinedSteps, name: str, args: str, startup_s: int) -> GateResult:
    spec = GateSpec.model_validate({"name": name, "metric": "decode_tps", "threshold": 55, "timeout_s": TIMEOUT_S,
                                    "command": f"{sys.executable} {SLOW_START} {args}"})  # fmt: skip
    request = GateInput(ticket_id="t1", attempt=1, gate=spec, host="local", startup_s=startup_s)
    return await ActivityEnvironment().run(GateActivities(steps).run_gate, request)


async def test_engine_start_ups_do_not_count_against_the_gates_measuring_timeout(
    steps: ConfinedSteps,
) -> None:
    # An alternating A/B of four 3-second starts and 2 s of rounds: 14 s of wall time, 2 s of it measuring.
    alternating = "3 2 30 4"
    results = await asyncio.gather(
        gate(steps, "alternating", alternating, startup_s=60),
        gate(steps, "before-the-patch", alternating, startup_s=0),  # a run started before gate-startup-time
        gate(steps, "measures-too-long", f"1 {TIMEOUT_S + 6} 30", startup_s=60),
        gate(steps, "start-past-its-limit", f"{TIMEOUT_S + 6} 0 1", startup_s=60),
        gate(steps, "starts-past-the-budget", alternating, startup_s=3),
    )
    passed, before, too_long, past_limit, past_budget = results
    assert passed.verdict is Verdict.PASS, passed.reason
    # Four starts of 3 s each, credited as the clock recorded them.
    spent = float(passed.evidence["engine_startup_s"].split()[0])
    assert 11.0 <= spent <= 30.0, passed.evidence
    assert before.verdict is Verdict.INVALID, before.reason
    assert f"timed out after {TIMEOUT_S}s:" in before.reason, before.reason
    assert "engine_startup_s" not in before.evidence
    for result in (too_long, past_limit, past_budget):
        assert result.verdict is Verdict.INVALID, (result.gate, result.reason)
        assert f"timed out after {TIMEOUT_S}s of measuring" in result.reason, result.reason
    # What each was credited: a start counts up to its own limit (1 s), all starts up to the gate's budget (3 s).
    assert float(past_limit.evidence["engine_startup_s"].split()[0]) <= 1.0 + 0.1
    assert float(past_budget.evidence["engine_startup_s"].split()[0]) == pytest.approx(3.0)


def test_overlapping_starts_count_once_and_lines_the_command_made_up_count_nothing(tmp_path: Path) -> None:
    clock = tmp_path / "clock"
    clock.write_text(
        "start a 100.0 50\n"
        "start b 105.0 50\n"  # started while a was starting: the wall time counts once
        "ready a 110.0\n"
        "ready b 112.0\n"
        "start c 90.0 1000\n"  # before the step began: only its part after `since` counts
        "ready c 101.0\n"
        "start d 200.0 nonsense\n"
        "garbage line\n"
        "start e 300.0 5\n"  # never ready: counts up to its limit
    )
    assert read_starts(clock)[0] == Start(100.0, 50.0, 110.0)
    assert startup_seconds(clock, since=95.0, now=400.0, budget_s=1000) == pytest.approx(17.0 + 5.0)
    assert startup_seconds(clock, since=95.0, now=302.0, budget_s=1000) == pytest.approx(17.0 + 2.0)
    assert startup_seconds(clock, since=95.0, now=400.0, budget_s=10) == 10
    assert startup_seconds(tmp_path / "absent", since=0.0, now=1.0, budget_s=10) == 0.0
