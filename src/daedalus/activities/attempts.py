"""Run one attempt of a coding agent in its own worktree (host queue). Idempotent across retries.

A retried activity never starts a second agent: `result.json` means the attempt is over (hand it back);
`running.json` means an agent was started (follow it to its end, or record that it ended unseen).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

from daedalus.activities.refs import RUN_ATTEMPT
from daedalus.activities.workspace import Workspace
from daedalus.agents import worktree as wt
from daedalus.agents.base import RESULT_FILE, RUNNING_FILE, USAGE_FILE, RunningRecord
from daedalus.agents.cli import CliAgent
from daedalus.agents.costs import load_usage
from daedalus.agents.prompt import build_prompt
from daedalus.agents.registry import CodingAgent, agent_for
from daedalus.agents.settings import AgentSettings
from daedalus.errors import AgentConfigError, GitError, InputError, SetupError, maps_errors
from daedalus.hosts.mirrors import ENVIRONMENT_ERROR, EngineRepoUnavailable
from daedalus.sandbox import SandboxError, bwrap_binary
from daedalus.schemas.agents import AgentResult, AgentTask, AgentUsage, ExitReason
from daedalus.schemas.steps import AttemptInput

log = structlog.get_logger(__name__)


def _checkout_status(repo: Path) -> str | None:
    """`git status` of a local engine checkout; None for a host's bare mirror, which has no files to change."""
    if wt.git("rev-parse", "--is-bare-repository", cwd=repo) == "true":
        return None
    return wt.git("status", "--porcelain", cwd=repo)


class AttemptActivities:
    def __init__(self, workspace: Workspace, settings: AgentSettings):
        self.workspace = workspace
        self.settings = settings

    @activity.defn(name=RUN_ATTEMPT.name)
    @maps_errors
    async def run_attempt(self, request: AttemptInput) -> AgentResult:
        spec = request.spec
        if spec.agent is None or spec.engine is None:
            raise InputError(f"ticket {spec.id} has no agent or engine to attempt; give its spec both")
        check_allowed_paths(spec.allowed_paths)
        try:
            bwrap_binary()  # before a worktree is made: an agent never runs outside its sandbox
        except SandboxError as error:
            raise SetupError(str(error)) from error
        settings = self.settings
        if spec.engine is not None and request.filing:
            self.workspace.claim(
                spec.id, request.attempt, request.filing, self.workspace.repo_path(spec.engine)
            )
        artifacts = self.workspace.attempt_artifacts(spec.id, request.attempt)
        result_file = artifacts / RESULT_FILE
        if result_file.exists():
            # A retry after the agent finished: hand back what it did, never run it twice.
            return AgentResult.model_validate_json(result_file.read_text())
        worktree = self.workspace.worktree(spec.id, request.attempt)
        branch = wt.branch_name(spec.id, request.attempt)
        try:
            repo = await asyncio.to_thread(self.workspace.sync_engine, spec.engine, spec.host)
        except EngineRepoUnavailable as error:
            # The host's environment, not the agent: no agent ran, so this spends no attempt (see ENVIRONMENT_ERROR).
            raise ApplicationError(str(error), type=ENVIRONMENT_ERROR, non_retryable=True) from error
        try:
            base = wt.prepare_worktree(
                repo=repo, base_commit=spec.engine.base_commit, worktree=worktree, branch=branch
            )
        except GitError as error:
            raise GitError(f"cannot prepare the attempt's worktree: {error}") from error
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
            title=spec.title,
            spec=spec.spec,
            constraints=spec.constraints,
            lessons=request.lessons,
            engine=spec.engine.name,
            idle_timeout_s=settings.idle_timeout_s,
            max_turns=settings.max_turns,
        )
        agent = agent_for(spec.agent, settings)
        repo_status = _checkout_status(repo)
        started = time.time()
        try:
            result = await self._run_or_follow(task, agent, artifacts, base)
        except asyncio.CancelledError:
            if isinstance(agent, CliAgent) and _leave_agent_running():
                raise  # the activity timed out, not the ticket: the retry follows the same agent
            _write_result(artifacts, _cancelled(task, agent, artifacts, started))
            raise
        if _checkout_status(repo) != repo_status:
            result = result.model_copy(
                update={
                    "exit_reason": ExitReason.FORBIDDEN,
                    "detail": f"the agent changed the engine checkout {repo} outside its worktree; "
                    f"inspect `git -C {repo} status`. {result.detail}",
                }
            )
        elif (
            result.exit_reason is ExitReason.COMMITTED
            and not wt.commits_since(worktree, base)
            and wt.commit_all(
                worktree,
                f"ticket {task.ticket_id} attempt {task.attempt}: changes left uncommitted by {agent.name}",
            )
        ):
            result = result.model_copy(
                update={
                    "detail": result.detail + "; the agent left its changes "
                    "uncommitted, daedalus committed them"
                }
            )
        result = verify(task, result, base)
        _write_result(artifacts, result)
        log.info("attempt finished", ticket_id=task.ticket_id, attempt=task.attempt, summary=result.summary())
        return result

    async def _run_or_follow(
        self, task: AgentTask, agent: CodingAgent, artifacts: Path, base: str
    ) -> AgentResult:
        (artifacts / "prompt.md").write_text(build_prompt(task))
        running = RunningRecord.read(artifacts / RUNNING_FILE)
        if running is not None:
            log.info(
                "attempt already started; following it",
                pid=running.pid,
                kind=running.kind,
                progress=activity.info().heartbeat_details[:1],
            )
            if running.kind == "process" and isinstance(agent, CliAgent):
                return await agent.attach(
                    task,
                    running,
                    artifacts=artifacts,
                    heartbeat=activity.heartbeat,
                    keep_on_cancel=_leave_agent_running,
                )
            return await _wait_for_worker(task, agent, running, artifacts)
        if wt.commits_since(Path(task.worktree), base):
            return _committed_earlier(task, agent, artifacts)
        try:
            return await agent.run(
                task, artifacts=artifacts, heartbeat=activity.heartbeat, keep_on_cancel=_leave_agent_running
            )
        except (AgentConfigError, SandboxError) as error:
            return _recorded(task, agent, artifacts, ExitReason.FAILED, str(error))


def check_allowed_paths(allowed: list[str]) -> None:
    """Allowed paths are relative and stay in the worktree; anything else is a spec error, not a retry."""
    bad = [p for p in allowed if Path(p).is_absolute() or p.startswith("~") or ".." in Path(p).parts]
    if bad:
        raise InputError(
            f"allowed_paths {bad} point outside the worktree; give paths relative to the repository root "
            "such as 'vllm/attention' (or '.' for all of it)"
        )


def _leave_agent_running() -> bool:
    """Only a timed-out or lost activity attempt leaves its agent for the retry; a cancelled ticket kills it."""
    try:
        details = activity.cancellation_details()
    except RuntimeError:
        return False
    return bool(details and (details.timed_out or details.not_found) and not details.cancel_requested)


async def _wait_for_worker(
    task: AgentTask, agent: CodingAgent, running: RunningRecord, artifacts: Path
) -> AgentResult:
    """An in-worker agent (tool loop, scripted) cannot be adopted: wait for its worker, or record its loss."""
    result_file = artifacts / RESULT_FILE
    while running.alive() and not result_file.exists():
        activity.heartbeat({"waiting_for_pid": running.pid})
        await asyncio.sleep(0.5)
    if result_file.exists():
        return AgentResult.model_validate_json(result_file.read_text())
    return _recorded(
        task,
        agent,
        artifacts,
        ExitReason.FAILED,
        f"the worker (pid {running.pid}) running this attempt stopped before it finished; "
        "not restarting the agent, which would pay for the attempt twice",
    )


def _cancelled(task: AgentTask, agent: CodingAgent, artifacts: Path, started: float) -> AgentResult:
    try:
        details = activity.cancellation_details()
    except RuntimeError:
        details = None
    why = (
        "the ticket was cancelled"
        if details is None or details.cancel_requested
        else f"activity ended: {details}"
    )
    return _recorded(
        task,
        agent,
        artifacts,
        ExitReason.CANCELLED,
        f"cancelled ({why}); the agent's process group was killed",
    ).model_copy(update={"duration_s": round(time.time() - started, 3)})


def _write_result(artifacts: Path, result: AgentResult) -> None:
    tmp = artifacts / (RESULT_FILE + ".tmp")
    tmp.write_text(result.model_dump_json(indent=2))
    tmp.replace(artifacts / RESULT_FILE)
    (artifacts / RUNNING_FILE).unlink(missing_ok=True)


def _committed_earlier(task: AgentTask, agent: CodingAgent, artifacts: Path) -> AgentResult:
    """The agent committed before the worker died, but no result was written: take the commit, not a rerun."""
    return _recorded(
        task,
        agent,
        artifacts,
        ExitReason.COMMITTED,
        "recovered the commit of an attempt whose worker stopped before recording it",
    )


def _recorded(
    task: AgentTask, agent: CodingAgent, artifacts: Path, reason: ExitReason, detail: str
) -> AgentResult:
    """A result Daedalus writes itself (the agent could not): with whatever usage the agent left on disk."""
    return AgentResult(
        ticket_id=task.ticket_id,
        attempt=task.attempt,
        agent=agent.label,
        exit_reason=reason,
        branch=task.branch,
        usage=load_usage(artifacts / USAGE_FILE) or AgentUsage(),
        artifacts=str(artifacts),
        detail=detail,
    )


def verify(task: AgentTask, result: AgentResult, base: str) -> AgentResult:
    """The agent's word never decides: only a commit on the branch, inside the allowed paths, counts."""
    worktree = Path(task.worktree)
    commits = wt.commits_since(worktree, base)
    if not commits:
        if result.exit_reason is ExitReason.COMMITTED:
            return result.model_copy(
                update={
                    "exit_reason": ExitReason.NO_COMMIT,
                    "commit": None,
                    "detail": f"no commit on {task.branch} and nothing changed; {result.detail}",
                }
            )
        return result.model_copy(update={"commit": None})
    outside = wt.outside_allowed(wt.changed_paths(worktree, base), task.allowed_paths)
    if outside:
        return result.model_copy(
            update={
                "exit_reason": ExitReason.FORBIDDEN,
                "commit": None,
                "diff_stat": wt.diff_stat(worktree, base),
                "detail": f"the commit touches paths the spec does not allow: {outside}; allowed: {task.allowed_paths}",
            }
        )
    if result.exit_reason is not ExitReason.COMMITTED:
        # A commit from an attempt that timed out, overspent or was cancelled does not count.
        return result.model_copy(
            update={
                "commit": None,
                "diff_stat": wt.diff_stat(worktree, base),
                "detail": f"{result.detail}; its commit {commits[0][:10]} is not counted",
            }
        )
    return result.model_copy(
        update={
            "commit": commits[0],
            "diff_stat": wt.diff_stat(worktree, base),
            "exit_reason": ExitReason.COMMITTED,
        }
    )
