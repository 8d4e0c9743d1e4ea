"""Run a gate's measuring command on the ticket's host, confined (activities/confined.py), and decide its verdict
(MEASUREMENT.md). The command's output is read by the worker outside the sandbox; the verdict is the worker's."""

import asyncio
import json
import time
from pathlib import Path

from pydantic import ValidationError
from temporalio import activity

from daedalus.activities.confined import ConfinedSteps, limits_note, startup_clock_path
from daedalus.activities.refs import RUN_GATE
from daedalus.engines.startup_clock import startup_seconds
from daedalus.errors import GitError, maps_errors
from daedalus.gates.contention import SEEN_KEY, OtherProcesses
from daedalus.gates.verdicts import judge
from daedalus.hosts.mirrors import EngineRepoUnavailable
from daedalus.paths import UnsafePathError, contained
from daedalus.processes import log_tail
from daedalus.schemas.gates import GateMeasurement, GateResult, Verdict
from daedalus.schemas.limits import GATE_OUTPUT_BYTES, MAX_GATE_SAMPLES
from daedalus.schemas.steps import GateInput


class GateActivities:
    def __init__(self, steps: ConfinedSteps):
        self.steps = steps
        self.workspace = steps.workspace

    @activity.defn(name=RUN_GATE.name)
    @maps_errors
    async def run_gate(self, request: GateInput) -> GateResult:
        """A command that crashes or prints no valid measurement is an INVALID verdict, never a FAIL."""
        gate = request.gate
        artifacts = self.workspace.attempt_artifacts(request.ticket_id, request.attempt)
        stem = f"gate-{gate.name}-round-{request.round}"
        try:
            stdout_path, log_path, pidfile = (
                contained(artifacts, f"{stem}.{suffix}") for suffix in ("json", "log", "pid")
            )
        except UnsafePathError as error:
            return self._invalid(request, str(error), {})
        log_path.unlink(missing_ok=True)
        workdir = self.workspace.worktree(request.ticket_id, request.attempt)
        if not workdir.exists():
            try:
                self._checkout_as_it_stands(request, workdir)
            except (GitError, EngineRepoUnavailable) as error:
                return self._invalid(request, f"cannot check out what to measure: {error}", {})
        scratch = artifacts / f"{stem}-scratch"
        began = time.monotonic()
        # Who else used the host meanwhile: the command's sandbox cannot see other processes, the worker can.
        others = await asyncio.to_thread(OtherProcesses)
        finished = await self.steps.run(
            gate.command,
            ticket_id=request.ticket_id,
            attempt=request.attempt,
            scratch=scratch,
            log_path=log_path,
            stdout_path=stdout_path,
            timeout_s=gate.timeout_s,
            heartbeat=activity.heartbeat,
            pidfile=pidfile,
            lease=request.lease,
            startup_budget_s=request.startup_s,
        )
        evidence = {"stdout": str(stdout_path), "log": str(log_path)}
        if busiest := await asyncio.to_thread(others.busiest):
            evidence[SEEN_KEY] = ", ".join(busiest)
        if request.startup_s:
            starting = startup_seconds(startup_clock_path(scratch), since=began, now=time.monotonic(),
                                       budget_s=request.startup_s)  # fmt: skip
            evidence["engine_startup_s"] = f"{starting:.1f} of {request.startup_s} (not counted in timeout_s)"
        if finished.limits_hit:
            return self._invalid(request, f"gate command {limits_note(finished)}", evidence)
        if finished.timed_out or finished.returncode != 0:
            what = (
                f"timed out after {gate.timeout_s}s"
                + (
                    f" of measuring (engine start-ups: {evidence['engine_startup_s']})"
                    if request.startup_s
                    else ""
                )
                if finished.timed_out
                else f"exited {finished.returncode}"
            )
            return self._invalid(request, f"gate command {what}: {log_tail(log_path, 600)}", evidence)
        try:
            measurement = parse_measurement(log_tail(stdout_path, GATE_OUTPUT_BYTES))
        except ValueError as error:
            return self._invalid(request, str(error), evidence)
        if finished.unlimited:
            evidence["limits"] = finished.unlimited
        measurement = measurement.model_copy(update={"evidence": {**measurement.evidence, **evidence}})
        return judge(gate, measurement, host=request.host, commit=request.commit)

    def _checkout_as_it_stands(self, request: GateInput, workdir: Path) -> None:
        """A ticket without an agent measures its engine at the base commit, or, with no engine, from an empty
        directory (its gate commands name what they measure)."""
        if request.engine is None:
            workdir.mkdir(parents=True, exist_ok=True)
            return
        self.workspace.check_out_as_it_stands(
            request.ticket_id, request.attempt, request.engine, request.host
        )

    @staticmethod
    def _invalid(request: GateInput, reason: str, evidence: dict[str, str]) -> GateResult:
        return GateResult(
            gate=request.gate.name,
            metric=request.gate.metric,
            verdict=Verdict.INVALID,
            reason=reason,
            rule=request.gate.describe(),
            method="command",
            host=request.host,
            commit=request.commit,
            evidence=evidence,
        )


def parse_measurement(stdout: str) -> GateMeasurement:
    """The last line of stdout that is a JSON object is the measurement (earlier lines may be progress)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"gate output is not a valid measurement: {error}") from error
            _refuse_oversampled(data)
            try:
                return GateMeasurement.model_validate(data)
            except ValidationError as error:
                raise ValueError(f"gate output is not a valid measurement: {error}") from error
    raise ValueError(
        "gate command printed no JSON measurement; print one line like "
        '{"samples": [56.1, 55.8], "unit": "tok/s"} on stdout'
    )


def _refuse_oversampled(data: object) -> None:
    """Counted before validation, so that a huge sample list is refused before it becomes a model."""
    if not isinstance(data, dict):
        return
    for field in ("samples", "baseline_samples"):
        values = data.get(field)
        if isinstance(values, list) and len(values) > MAX_GATE_SAMPLES:
            raise ValueError(
                f"gate measurement has {len(values)} {field}, more than the {MAX_GATE_SAMPLES} a verdict may "
                f"carry; aggregate rounds (e.g. one median per round) before printing them"
            )
