"""Run a gate's measuring command on the ticket's host and decide its verdict (MEASUREMENT.md)."""

import json
from pathlib import Path

from pydantic import ValidationError
from temporalio import activity

from daedalus.activities.workspace import Workspace
from daedalus.agents.worktree import prepare_worktree
from daedalus.errors import GitError, maps_errors
from daedalus.gates.verdicts import decide
from daedalus.processes import log_tail, run_logged
from daedalus.schemas.gates import GateMeasurement, GateResult, Verdict
from daedalus.schemas.steps import GateInput


class GateActivities:
    def __init__(self, workspace: Workspace):
        self.workspace = workspace

    @activity.defn(name="run_gate")
    @maps_errors
    async def run_gate(self, request: GateInput) -> GateResult:
        """A command that crashes or prints no valid measurement is an INVALID verdict, never a FAIL."""
        gate = request.gate
        artifacts = self.workspace.attempt_artifacts(request.ticket_id, request.attempt)
        stem = f"gate-{gate.name}-round-{request.round}"
        stdout_path, log_path = artifacts / f"{stem}.json", artifacts / f"{stem}.log"
        log_path.unlink(missing_ok=True)
        workdir = self.workspace.worktree(request.ticket_id, request.attempt)
        if not workdir.exists():
            try:
                self._checkout_as_it_stands(request, workdir)
            except (GitError, FileNotFoundError) as error:
                return self._invalid(request, f"cannot check out what to measure: {error}", {})
        finished = await run_logged(
            gate.command,
            cwd=workdir,
            log_path=log_path,
            stdout_path=stdout_path,
            timeout_s=gate.timeout_s,
            heartbeat=activity.heartbeat,
            pidfile=artifacts / f"{stem}.pid",
        )
        evidence = {"stdout": str(stdout_path), "log": str(log_path)}
        if finished.timed_out or finished.returncode != 0:
            what = (
                f"timed out after {gate.timeout_s}s"
                if finished.timed_out
                else f"exited {finished.returncode}"
            )
            return self._invalid(request, f"gate command {what}: {log_tail(log_path, 600)}", evidence)
        try:
            measurement = parse_measurement(stdout_path.read_text())
        except ValueError as error:
            return self._invalid(request, str(error), evidence)
        measurement = measurement.model_copy(update={"evidence": {**measurement.evidence, **evidence}})
        return decide(gate, measurement, host=request.host, commit=request.commit)

    @staticmethod
    def _checkout_as_it_stands(request: GateInput, workdir: Path) -> None:
        """A ticket without an agent measures its engine at the base commit, or, with no engine, from an empty
        directory (its gate commands name what they measure)."""
        if request.engine is None:
            workdir.mkdir(parents=True, exist_ok=True)
            return
        repo = Path(request.engine.repo).expanduser()
        if not (repo / ".git").exists():
            raise FileNotFoundError(f"engine repo {repo} is not a git checkout on host {request.host}")
        branch = f"daedalus/{request.ticket_id}/as-it-stands"
        prepare_worktree(repo=repo, base_commit=request.engine.base_commit, worktree=workdir, branch=branch)

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
                return GateMeasurement.model_validate(json.loads(line))
            except (json.JSONDecodeError, ValidationError) as error:
                raise ValueError(f"gate output is not a valid measurement: {error}") from error
    raise ValueError(
        "gate command printed no JSON measurement; print one line like "
        '{"samples": [56.1, 55.8], "unit": "tok/s"} on stdout'
    )
