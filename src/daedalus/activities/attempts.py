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
from daedalus.errors import (
    AgentConfigError,
    GitError,
    InputError,
    OutsideAllowed,
    SetupError,
    TreeRefused,
    maps_errors,
)
from daedalus.hosts.mirrors import ENVIRONMENT_ERROR, EngineRepoUnavailable
from daedalus.sandbox import SandboxError, bwrap_binary
from daedalus.schemas.agents import AgentResult, AgentTask, AgentUsage, ExitReason
from daedalus.schemas.steps import AttemptInput, ResourceLimits

log = structlog.get_logger(__name__)


class AttemptActivities:
    def __init__(
        self,
        workspace: Workspace,
        settings: AgentSettings,
        limits: ResourceLimits | None = None,
        cgroup_root: Path | None = None,
    ):
        self.workspace = workspace
        self.settings = settings
        self.limits = limits
        """The host's step limits, which the agent's program and every command it runs are held to."""
        self.cgroup_root = cgroup_root

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
            base = await asyncio.to_thread(self.workspace.check_out_attempt, spec, request.attempt, repo)
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
            limits=self.limits,
            cgroup_root=str(self.cgroup_root) if self.cgroup_root is not None else None,
        )
        agent = agent_for(spec.agent, settings)
        started = time.time()
        try:
            result = await self._run_or_follow(task, agent, artifacts, base)
        except asyncio.CancelledError:
            if isinstance(agent, CliAgent) and _leave_agent_running():
                raise  # the activity timed out, not the ticket: the retry follows the same agent
            _write_result(artifacts, _cancelled(task, agent, artifacts, started))
            raise
        result = await asyncio.to_thread(self._settle, task, result, repo, base)
        _write_result(artifacts, result)
        log.info("attempt finished", ticket_id=task.ticket_id, attempt=task.attempt, summary=result.summary())
        return result

    def _settle(self, task: AgentTask, result: AgentResult, repo: Path, base: str) -> AgentResult:
        """The host commits what the agent left (`settle`), then makes the worktree a clean checkout of that
        commit for the build and the gates: what they measure is the commit, not the agent's leftovers."""
        settled = settle(task, result, repo, base)
        if settled.commit is not None:
            self.workspace.check_out_attempt_result(task.ticket_id, task.attempt, repo, settled.commit)
        return settled

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
        if wt.branch_head(Path(task.repo), task.branch) not in (None, base):
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


def settle(task: AgentTask, result: AgentResult, repo: Path, base: str) -> AgentResult:
    """The agent's word never decides: the host commits the worktree's files onto the attempt's branch itself,
    and only a commit inside the allowed paths counts. An attempt that did not finish commits nothing."""
    worktree = Path(task.worktree)
    if result.exit_reason is not ExitReason.COMMITTED:
        # An attempt that timed out, overspent, failed or was cancelled does not count, whatever it left.
        return result.model_copy(update={"commit": None})
    message = f"ticket {task.ticket_id} attempt {task.attempt}: {task.title}\n\nBy {result.agent}."
    try:
        captured = wt.capture(
            repo=repo, worktree=worktree, base=base, branch=task.branch, message=message,
            allowed=task.allowed_paths,
        )  # fmt: skip
    except OutsideAllowed as outside:
        return result.model_copy(
            update={
                "exit_reason": ExitReason.FORBIDDEN,
                "commit": None,
                "diff_stat": outside.diff_stat,
                "detail": f"the change touches paths the spec does not allow: {outside.paths}; "
                f"allowed: {task.allowed_paths}",
            }
        )
    except TreeRefused as refused:
        return result.model_copy(
            update={"exit_reason": ExitReason.FORBIDDEN, "commit": None, "detail": str(refused)}
        )
    if captured.commit is None:
        return result.model_copy(
            update={
                "exit_reason": ExitReason.NO_COMMIT,
                "commit": None,
                "detail": f"the worktree is unchanged from {base[:12]}; {result.detail}",
            }
        )
    return result.model_copy(update={"commit": captured.commit, "diff_stat": captured.diff_stat})
