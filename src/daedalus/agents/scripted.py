"""The scripted agent: applies the spec's patch and runs its commands, then commits. Demos and tests only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from daedalus.agents import worktree as wt
from daedalus.processes import run_logged
from daedalus.schemas.agents import AgentResult, AgentTask, AgentUsage, ExitReason

LABEL = "scripted (demo/test agent: applies the spec's patch; no model involved)"


class ScriptedAgent:
    """Deterministic stand-in for a coding agent: `git apply` the patch, run the commands, commit."""

    name = "scripted"

    async def run(self, task: AgentTask, *, log_path: Path, heartbeat: Callable[[], None]) -> AgentResult:
        worktree = Path(task.worktree)
        base = wt.git("merge-base", "HEAD", task.base_commit, cwd=worktree)

        def result(reason: ExitReason, detail: str, commit: str | None = None) -> AgentResult:
            return AgentResult(
                ticket_id=task.ticket_id,
                attempt=task.attempt,
                agent=LABEL,
                exit_reason=reason,
                branch=task.branch,
                commit=commit,
                diff_stat=wt.diff_stat(worktree, base) if commit else "",
                transcript=str(log_path),
                usage=AgentUsage(cost_usd=0.0, cost_source="provider"),
                detail=detail,
            )

        if task.agent.patch:
            patch_file = log_path.with_suffix(".patch")
            patch_file.write_text(task.agent.patch)
            applied = await run_logged(
                f"git apply --whitespace=nowarn {patch_file}",
                cwd=worktree, log_path=log_path, timeout_s=60, heartbeat=heartbeat,
            )
            if applied.returncode != 0:
                return result(ExitReason.FAILED, f"patch does not apply: {applied.tail(800)}")
        for command in task.agent.commands:
            done = await run_logged(command, cwd=worktree, log_path=log_path, timeout_s=task.timeout_s, heartbeat=heartbeat)
            if done.returncode != 0:
                return result(ExitReason.FAILED, f"command {command!r} exited {done.returncode}: {done.tail(800)}")
        wt.git("add", "-A", cwd=worktree)
        if not wt.git("status", "--porcelain", cwd=worktree):
            return result(ExitReason.NO_COMMIT, "the patch and commands changed nothing")
        wt.git(
            "-c", "user.name=daedalus-scripted", "-c", "user.email=scripted@daedalus.local",
            "commit", "-q", "-m", f"ticket {task.ticket_id} attempt {task.attempt} (scripted)",
            cwd=worktree,
        )
        return result(ExitReason.COMMITTED, "applied the spec's patch", commit=wt.git("rev-parse", "HEAD", cwd=worktree))
