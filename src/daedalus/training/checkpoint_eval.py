"""A training run's evaluation hook: measure one complete checkpoint, confined as a ticket's gate is.

The run names a gate (`evaluation.gate`) whose command prints one `GateMeasurement` line: for a drafter, its
acceptance length against a baseline. It runs on the run's host in a sandbox (daedalus.sandbox) under the host's
step limits: the run's working directory and the checkpoint read-only, a scratch directory of its own writable,
no network, the run's leased GPUs only, and nothing of it left alive after it. It sees `DAEDALUS_CHECKPOINT` (the
checkpoint's directory) and `DAEDALUS_CHECKPOINT_STEP`. The worker, outside, reads what it printed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from daedalus.confinement import StepSettings, gpu_device_nodes
from daedalus.engines.paths import cache_root
from daedalus.processes import Finished, run_logged
from daedalus.sandbox import Sandbox
from daedalus.schemas.steps import ResourceLimits
from daedalus.schemas.training import EvaluationInput

TRAILING_NUMBER = re.compile(r"(\d+)$")


def checkpoint_step(checkpoint: Path) -> int | None:
    """The step a checkpoint holds: its state.json's `step`, else the number its name ends with."""
    try:
        step = json.loads((checkpoint / "state.json").read_text()).get("step")
        if isinstance(step, int) and step >= 0:
            return step
    except (OSError, ValueError, AttributeError):
        pass
    found = TRAILING_NUMBER.search(checkpoint.name)
    return int(found.group(1)) if found else None


def evaluation_dir(artifact_root: Path, inp: EvaluationInput) -> Path:
    """Per start of the run (`filing`) and checkpoint: a retried evaluation writes over its own files only."""
    return artifact_root / "training" / inp.spec.name / inp.filing / "evaluations" / Path(inp.checkpoint).name


@dataclass(frozen=True)
class EvaluationRun:
    finished: Finished
    stdout: Path
    log: Path


async def run_evaluation(
    inp: EvaluationInput,
    *,
    artifact_root: Path,
    steps: StepSettings,
    limits: ResourceLimits,
    heartbeat: Callable[[], None],
    step: int | None,
) -> EvaluationRun:
    """Run the evaluation command on the checkpoint, confined; its stdout and log are kept under the artifacts."""
    assert inp.spec.evaluation is not None, "only a run with an evaluation evaluates its checkpoints"
    gate = inp.spec.evaluation.gate
    checkpoint = Path(inp.checkpoint)
    where = evaluation_dir(artifact_root, inp)
    work, scratch = where / "work", where / "scratch"
    work.mkdir(parents=True, exist_ok=True)
    stdout, log = where / "measurement.json", where / "evaluation.log"
    log.unlink(missing_ok=True)
    lease = inp.lease
    env = {
        **inp.spec.env,
        **(lease.environment() if lease is not None else {}),
        "DAEDALUS_CHECKPOINT": str(checkpoint),
        "DAEDALUS_CHECKPOINT_STEP": "" if step is None else str(step),
        "DAEDALUS_TRAINING_RUN": inp.spec.name,
    }
    cwd = inp.spec.cwd.expanduser().resolve()
    sandbox = Sandbox.for_step(
        work,
        objects=None,
        scratch=scratch,
        cache=cache_root(),
        read_only=[cwd, checkpoint.resolve(), *steps.read_only],
        devices=gpu_device_nodes(lease.gpus) if lease is not None else [],
        env=env,
        tmp_mib=limits.tmp_mib,
    )
    finished = await run_logged(
        gate.command,
        cwd=cwd,
        log_path=log,
        stdout_path=stdout,
        timeout_s=gate.timeout_s,
        heartbeat=heartbeat,
        pidfile=where / "evaluation.pid",
        sandbox=sandbox,
        limits=limits,
        cgroup_root=steps.cgroup_root,
    )
    return EvaluationRun(finished, stdout, log)
