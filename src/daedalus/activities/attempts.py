"""Run one attempt of a coding agent in its own worktree (host queue). Idempotent across retries."""

from __future__ import annotations

from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from daedalus.activities.workspace import Workspace
from daedalus.agents import worktree as wt
from daedalus.agents.registry import AgentUnavailable, agent_for
from daedalus.schemas.agents import AgentResult, AgentTask, ExitReason
from daedalus.schemas.steps import AttemptInput


class AttemptActivities:
    def __init__(self, workspace: Workspace):
        self.workspace = workspace

    @activity.defn(name="run_attempt")
    async def run_attempt(self, request: AttemptInput) -> AgentResult:
        spec = request.spec
        if spec.agent is None or spec.engine is None:
            raise ApplicationError(f"ticket {spec.id} has no agent or engine to attempt", non_retryable=True)
        artifacts = self.workspace.attempt_artifacts(spec.id, request.attempt)
        result_file = artifacts / "result.json"
        if result_file.exists():
            # A retry after the agent finished: hand back what it did, never run it twice.
            return AgentResult.model_validate_json(result_file.read_text())
        worktree = self.workspace.worktree(spec.id, request.attempt)
        branch = wt.branch_name(spec.id, request.attempt)
        repo = Path(spec.engine.repo).expanduser()
        if not (repo / ".git").exists():
            raise ApplicationError(
                f"engine repo {repo} is not a git checkout on host {spec.host}; clone it there first",
                non_retryable=True,
            )
        base = wt.prepare_worktree(repo=repo, base_commit=spec.engine.base_commit, worktree=worktree, branch=branch)
        task = AgentTask(
            ticket_id=spec.id,
            attempt=request.attempt,
            agent=spec.agent,
            brief=request.brief,
            repo=str(repo),
            base_commit=base,
            worktree=str(worktree),
            branch=branch,
            allowed_paths=spec.allowed_paths,
        )
        if wt.commits_since(worktree, base):
            result = _committed_earlier(task, base, artifacts)
        else:
            (artifacts / "brief.md").write_text(request.brief)
            try:
                agent = agent_for(spec.agent)
            except AgentUnavailable as error:
                raise ApplicationError(str(error), non_retryable=True) from error
            result = await agent.run(
                task, log_path=artifacts / "transcript.log", heartbeat=activity.heartbeat
            )
        result = verify(task, result, base)
        tmp = result_file.with_suffix(".tmp")
        tmp.write_text(result.model_dump_json(indent=2))
        tmp.replace(result_file)
        return result


def _committed_earlier(task: AgentTask, base: str, artifacts: Path) -> AgentResult:
    """The agent committed before the worker died, but no result was written: take the commit, not a rerun."""
    worktree = Path(task.worktree)
    return AgentResult(
        ticket_id=task.ticket_id,
        attempt=task.attempt,
        agent=task.agent.name.value,
        exit_reason=ExitReason.COMMITTED,
        branch=task.branch,
        commit=wt.git("rev-parse", "HEAD", cwd=worktree),
        transcript=str(artifacts / "transcript.log"),
        detail="recovered the commit of an attempt whose worker stopped before recording it",
    )


def verify(task: AgentTask, result: AgentResult, base: str) -> AgentResult:
    """The agent's word never decides: only a commit on the branch, inside the allowed paths, counts."""
    worktree = Path(task.worktree)
    commits = wt.commits_since(worktree, base)
    if not commits:
        reason = result.exit_reason if result.exit_reason is not ExitReason.COMMITTED else ExitReason.NO_COMMIT
        return result.model_copy(update={"exit_reason": reason, "commit": None})
    outside = wt.outside_allowed(wt.changed_paths(worktree, base), task.allowed_paths)
    if outside:
        return result.model_copy(
            update={
                "exit_reason": ExitReason.FORBIDDEN,
                "detail": f"the commit touches paths the spec does not allow: {outside}; allowed: {task.allowed_paths}",
            }
        )
    return result.model_copy(
        update={"commit": commits[0], "diff_stat": wt.diff_stat(worktree, base), "exit_reason": ExitReason.COMMITTED}
    )
