"""A real llama.cpp decode gate, confined as a ticket's gate runs it, on a quiet host and beside a CPU burner
(MEASUREMENT.md: contention is part of the evidence; issue 25 item 7).

On a quiet host the gate's verdict is the candidate's, as before: an unreachable bar FAILs and a low one PASSes,
with each round's load recorded. With child processes spinning on every core during its rounds, the same gate
is INVALID, its reason naming the contention: how much of the CPUs other work took, and (seen by the worker,
outside the gate's sandbox) which processes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from daedalus.activities.confined import ConfinedSteps
from daedalus.activities.gates import GateActivities
from daedalus.activities.workspace import Workspace
from daedalus.confinement import StepSettings
from daedalus.engines.llama_build import LlamaBuild
from daedalus.gates import contention
from daedalus.gates.verdicts import judge
from daedalus.schemas.gates import GateResult, GateSpec, Verdict
from daedalus.schemas.steps import GateInput, ResourceLimits

pytestmark = pytest.mark.llama

ROUNDS = 5
UNREACHABLE = 1e6  # tok/s: no tiny model on a CPU decodes this fast, so a quiet run's verdict is a real FAIL
SPIN = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass\n"
QUIET_TRIES = 3


@pytest.fixture
def steps(tmp_path: Path) -> ConfinedSteps:
    workspace = Workspace(root=tmp_path / "ws", artifacts=tmp_path / "artifacts")
    return ConfinedSteps(workspace, StepSettings(), ResourceLimits())


async def decode_gate(steps: ConfinedSteps, name: str) -> GateResult:
    spec = GateSpec.model_validate({
        "name": name, "metric": "decode_tps", "threshold": UNREACHABLE, "timeout_s": 300,
        "command": f"daedalus engine measure decode_tps --preset local-f16 --model tiny --rounds {ROUNDS} "
                   "--max-tokens 512",
    })  # fmt: skip
    request = GateInput(ticket_id="t1", attempt=1, gate=spec, host="local", startup_s=600)
    return await ActivityEnvironment().run(GateActivities(steps).run_gate, request)


@contextlib.contextmanager
def burning() -> Iterator[list[int]]:
    """A child process spinning on each CPU this host gives us; ended by their ids."""
    children = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in os.sched_getaffinity(0)]
    time.sleep(0.5)
    try:
        yield [child.pid for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()


def low_bar(result: GateResult) -> GateResult:
    """The same measurement judged against a bar the tiny model clears."""
    assert result.gate_spec is not None and result.measurement is not None, result.reason
    return judge(result.gate_spec.model_copy(update={"threshold": 1.0}), result.measurement)


async def test_a_quiet_hosts_gate_still_fails_and_passes_as_before(
    steps: ConfinedSteps, llama_build: LlamaBuild, tiny_model: Path
) -> None:
    tries: list[str] = []
    for attempt in range(QUIET_TRIES):
        result = await decode_gate(steps, f"quiet-{attempt}")
        assert result.measurement is not None, result.reason
        loads = result.measurement.host_load
        assert len(loads) == ROUNDS and all(load.cpus >= 1 and load.wall_s > 0 for load in loads), loads
        assert all(load.own_cpu_s > 0 for load in loads), "the engine's decoding is the measurement's own CPU"
        judged = contention.pooled(loads)
        assert judged is not None
        if not judged.contended:
            break
        # Someone else's work landed on this shared host meanwhile: the verdict must say so, never FAIL.
        assert result.verdict is Verdict.INVALID and "busy with other work" in result.reason, result.reason
        tries.append(result.host_load or "")
    else:
        pytest.skip(f"the host was never quiet for {ROUNDS} rounds in {QUIET_TRIES} tries: {tries}")
    assert result.verdict is Verdict.FAIL, result.reason
    assert result.host_load is not None and "; not contended" in result.host_load
    assert result.evidence["host_load"] == result.host_load
    rounds = [key for key in result.evidence if key.startswith("load candidate round ")]
    assert len(rounds) == ROUNDS and all("of 2 CPUs" in result.evidence[k] for k in rounds), result.evidence
    passed = low_bar(result)
    assert passed.verdict is Verdict.PASS, passed.reason


async def test_the_same_gate_beside_a_cpu_burner_is_invalid_and_names_the_contention(
    steps: ConfinedSteps, llama_build: LlamaBuild, tiny_model: Path
) -> None:
    with burning() as burners:
        result = await decode_gate(steps, "burned")
    assert result.verdict is Verdict.INVALID, result.reason
    assert result.reason.startswith(
        "measurement invalid: the host was busy with other work while the rounds ran"
    ), result.reason
    assert result.measurement is not None
    judged = contention.pooled(result.measurement.host_load)
    assert judged is not None and judged.low >= contention.CONTENDED_SHARE, result.host_load
    assert f"of {judged.loads[0].cpus} CPUs over {ROUNDS} measured rounds" in result.reason
    # The gate's sandbox cannot see the burners; the worker outside it names them.
    assert any(f"(pid {pid})" in result.evidence[contention.SEEN_KEY] for pid in burners), result.evidence
    assert any(f"(pid {pid})" in result.reason for pid in burners), result.reason
    # A bar the candidate cleared despite the burners is still a PASS: contention only slows it down.
    passed = low_bar(result)
    assert passed.verdict is Verdict.PASS and "ran while other work took the host" in passed.reason, (
        passed.reason
    )
