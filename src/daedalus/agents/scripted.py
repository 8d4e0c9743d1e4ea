"""The scripted agent: applies the spec's patch and runs its commands. Demos and tests only.

A command that prints a `TRAP:` line reports a trap, as a model agent's final message would."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from daedalus.agents.base import RUNNING_FILE, Heartbeat, RunningRecord, command_sandbox
from daedalus.agents.prompt import reported_traps
from daedalus.agents.settings import AgentSettings
from daedalus.processes import run_logged
from daedalus.schemas.agents import AgentResult, AgentTask, AgentUsage, ExitReason

LABEL = "scripted (demo/test agent: applies the spec's patch; no model involved)"
LOG_FILE = "transcript.log"


class ScriptedAgent:
    """Deterministic stand-in for a coding agent: `git apply` the patch, run the commands.

    The patch is applied and the commands run in the worktree's sandbox, like any agent's commands; the host
    then commits what they left, as it does for every agent (daedalus.agents.worktree.capture)."""

    name = "scripted"
    label = LABEL

    def __init__(self, settings: AgentSettings):
        self.settings = settings

    async def run(
        self,
        task: AgentTask,
        *,
        artifacts: Path,
        heartbeat: Heartbeat,
        keep_on_cancel: Callable[[], bool] = lambda: False,
    ) -> AgentResult:
        started = time.time()
        worktree = Path(task.worktree)
        log_path = artifacts / LOG_FILE
        RunningRecord.of(os.getpid(), kind="worker", agent=self.name).write(artifacts / RUNNING_FILE)
        patch_file = artifacts / "spec.patch"
        sandbox = command_sandbox(task, self.settings)
        sandbox = replace(sandbox, read_only=(*sandbox.read_only, patch_file))
        cgroup_root = Path(task.cgroup_root) if task.cgroup_root else None

        def beat() -> None:
            heartbeat({"agent": self.name})

        def result(reason: ExitReason, detail: str) -> AgentResult:
            return AgentResult(
                ticket_id=task.ticket_id,
                attempt=task.attempt,
                agent=LABEL,
                exit_reason=reason,
                branch=task.branch,
                transcript=str(log_path),
                # No model ran: there are no tokens, and no provider to report a cost. Say so, not "$0.00".
                usage=AgentUsage(cost_usd=None, cost_source="unavailable", model=None),
                detail=f"[scripted] {detail}",
                duration_s=round(time.time() - started, 3),
                artifacts=str(artifacts),
                traps=reported_traps(log_path.read_text(errors="replace")) if log_path.exists() else [],
            )

        if task.agent.patch:
            patch_file.write_text(task.agent.patch)
            applied = await run_logged(
                f"git apply --whitespace=nowarn {shlex.quote(str(patch_file))}",
                cwd=worktree,
                log_path=log_path,
                timeout_s=60,
                heartbeat=beat,
                sandbox=sandbox,
                limits=task.limits,
                cgroup_root=cgroup_root,
            )
            if applied.returncode != 0:
                return result(ExitReason.FAILED, f"patch does not apply: {applied.tail(800)}")
        for command in task.agent.commands:
            done = await run_logged(
                command,
                cwd=worktree,
                log_path=log_path,
                timeout_s=task.timeout_s,
                heartbeat=beat,
                sandbox=sandbox,
                limits=task.limits,
                cgroup_root=cgroup_root,
            )
            if done.returncode != 0:
                hit = "; ".join(done.limits_hit)
                return result(
                    ExitReason.FAILED,
                    f"command {command!r} exited {done.returncode}"
                    + (f" (it {hit})" if hit else "")
                    + f": {done.tail(800)}",
                )
        return result(ExitReason.COMMITTED, "applied the spec's patch")
