"""A gate name from a stored history or a hand-built input cannot write or delete outside the artifact dir."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from daedalus.activities.confined import ConfinedSteps
from daedalus.activities.gates import GateActivities
from daedalus.activities.workspace import Workspace
from daedalus.confinement import StepSettings
from daedalus.paths import UnsafePathError, contained
from daedalus.schemas.gates import GateSpec, Metric, Verdict
from daedalus.schemas.steps import GateInput, ResourceLimits


def confined(workspace: Workspace) -> ConfinedSteps:
    return ConfinedSteps(workspace, StepSettings(), ResourceLimits())


def test_contained_refuses_names_that_leave_their_directory(tmp_path: Path) -> None:
    assert contained(tmp_path, "tickets", "4", "attempt-1") == tmp_path / "tickets" / "4" / "attempt-1"
    for parts in (("..", "x"), ("/etc/passwd",), ("a", "..", "..", "b"), ("gate-x/../../../../escape/pwn",)):
        with pytest.raises(UnsafePathError, match="would leave"):
            contained(tmp_path, *parts)


def test_contained_refuses_a_symlink_planted_inside(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePathError):
        contained(tmp_path / "root", "link", "file")


async def test_a_traversing_gate_name_neither_deletes_nor_writes_outside_the_artifacts(
    tmp_path: Path,
) -> None:
    artifacts = tmp_path / "artifacts"
    victim = tmp_path / "escape" / "pwn-round-1.log"
    victim.parent.mkdir()
    victim.write_text("precious")
    # model_construct skips the schema's slug rule, as an input from an older stored history would
    gate = GateSpec.model_construct(
        name="x/../../../../../escape/pwn",
        metric=Metric.DECODE_TPS,
        op=None,
        threshold=1.0,
        command="echo '{\"samples\": [2.0]}' > /dev/null; touch written",
        timeout_s=30,
    )
    request = GateInput.model_construct(
        ticket_id="t1", attempt=1, round=1, gate=gate, host="local", commit="", engine=None
    )
    activities = GateActivities(confined(Workspace(root=tmp_path / "work", artifacts=artifacts)))
    result = await ActivityEnvironment().run(activities.run_gate, request)
    assert result.verdict is Verdict.INVALID
    assert "would leave" in result.reason
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts", "escape"]


async def test_a_gate_that_prints_too_many_samples_is_invalid_with_the_cap(tmp_path: Path) -> None:
    gate = GateSpec(
        name="many",
        metric=Metric.DECODE_TPS,
        threshold=1.0,
        command="python3 -c \"import json; print(json.dumps({'samples': [1.0] * 10000}))\"",
        timeout_s=60,
    )
    request = GateInput(ticket_id="t2", attempt=1, gate=gate, host="local")
    activities = GateActivities(confined(Workspace(root=tmp_path / "work", artifacts=tmp_path / "artifacts")))
    result = await ActivityEnvironment().run(activities.run_gate, request)
    assert result.verdict is Verdict.INVALID
    assert "10000 samples, more than the 1000 a verdict may carry" in result.reason
