"""run_attempt through a real Temporal worker and the real Codex CLI: retries never start a second agent, cancel
leaves no process."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from daedalus.activities.attempts import AttemptActivities
from daedalus.activities.workspace import Workspace
from daedalus.agents.base import RESULT_FILE, RUNNING_FILE
from daedalus.agents.model_server import EditFile, ModelScript, ModelServer, Reply, Shell
from daedalus.schemas._base import Model
from daedalus.schemas.agents import AgentResult, ExitReason
from daedalus.schemas.steps import AttemptInput
from tests.agents.clis import cli_settings, hanging, new_key
from tests.agents.fakes import unique_sleep
from tests.support import make_engine_repo, ticket_spec


class Probe(Model):
    request: AttemptInput
    start_to_close_s: float = 60
    heartbeat_s: float = 5
    max_attempts: int = 1


@workflow.defn(sandboxed=False)
class AttemptProbe:
    """Calls run_attempt by name, the way the ticket workflow does."""

    @workflow.run
    async def run(self, probe: Probe) -> AgentResult:
        return await workflow.execute_activity(
            "run_attempt",
            probe.request,
            result_type=AgentResult,
            start_to_close_timeout=timedelta(seconds=probe.start_to_close_s),
            heartbeat_timeout=timedelta(seconds=probe.heartbeat_s),
            retry_policy=RetryPolicy(
                maximum_attempts=probe.max_attempts, initial_interval=timedelta(seconds=0.2)
            ),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )


def slow_change(marker: str, seconds: int = 6) -> ModelScript:
    """What the real Codex CLI is told to do: a command that takes `seconds` (named by `marker`), then the edit."""
    return ModelScript.of(
        Shell(f"timeout {marker} sleep {seconds}"),
        EditFile("speed.txt", "28.9", "56.0"),
        Reply("RESULT: success"),
    )


class Env:
    """The attempt activity on a real worker, its agent the real Codex CLI answering the local model server."""

    def __init__(self, tmp_path: Path, client: Client, queue: str, server: ModelServer):
        self.tmp_path = tmp_path
        self.client = client
        self.queue = queue
        self.server = server
        self.repo = make_engine_repo(tmp_path / "engine")
        self.workspace = Workspace(root=tmp_path / "ws", artifacts=tmp_path / "artifacts")
        self.marker = unique_sleep()
        self.script = self.use(slow_change(self.marker))

    def use(self, script: ModelScript) -> ModelScript:
        self.key = new_key()
        self.activities = AttemptActivities(self.workspace, cli_settings(self.server, self.key))
        return self.server.add(self.key, script)

    def request(self, agent: dict[str, Any] | None = None, **overrides: Any) -> AttemptInput:
        spec = ticket_spec(
            self.repo, "h1", agent=agent or {"name": "codex", "model": "gpt-5-codex"}, **overrides
        )
        return AttemptInput(spec=spec, attempt=1, brief="attempt 1")

    def worker(self) -> Worker:
        return Worker(
            self.client,
            task_queue=self.queue,
            workflows=[AttemptProbe],
            activities=[self.activities.run_attempt],
        )

    async def run(self, probe: Probe) -> AgentResult:
        return await self.client.execute_workflow(
            AttemptProbe.run, probe, id=f"probe-{uuid.uuid4()}", task_queue=self.queue
        )

    def starts(self) -> int:
        """How many Codex CLIs began this run's conversation (each sends its first request at step 0)."""
        return sum(1 for a in self.server.arrivals if a.key == self.key and a.step == 0)


@pytest.fixture(scope="module")
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


@pytest.fixture
def env(tmp_path: Path, temporal_client: Client, task_queue: str, model_server: ModelServer) -> Env:
    return Env(tmp_path, temporal_client, task_queue, model_server)


async def test_a_retried_activity_follows_the_running_agent_instead_of_starting_another(env: Env) -> None:
    # The first activity attempt times out at 4s while the agent needs 6s for its command alone: Temporal
    # retries it, and the retry follows the same Codex. (4s, not less: the first attempt must have made the
    # worktree before it times out, or its retry makes it again beside it.)
    probe = Probe(request=env.request(), start_to_close_s=4, heartbeat_s=5, max_attempts=8)
    async with env.worker():
        result = await env.run(probe)
    assert env.starts() == 1, "a retried activity must not start a second agent"
    assert result.exit_reason is ExitReason.COMMITTED, result.detail
    assert result.commit and result.usage.input_tokens == env.script.totals().input_tokens
    assert "followed after a worker retry" in result.detail


async def test_cancelling_kills_the_agent_group_and_records_a_cancelled_attempt(env: Env) -> None:
    request = env.request()
    async with env.worker():
        handle = await env.client.start_workflow(
            AttemptProbe.run,
            Probe(request=request, heartbeat_s=2),
            id=f"probe-{uuid.uuid4()}",
            task_queue=env.queue,
        )
        artifacts = env.workspace.attempt_artifacts(request.spec.id, 1)
        for _ in range(400):
            if hanging(env.marker) and (artifacts / RUNNING_FILE).exists():
                break
            await asyncio.sleep(0.05)
        agent_pid = json.loads((artifacts / RUNNING_FILE).read_text())["pid"]
        assert hanging(env.marker), "the agent's command runs"
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    result = AgentResult.model_validate_json((artifacts / RESULT_FILE).read_text())
    assert result.exit_reason is ExitReason.CANCELLED and "killed" in result.detail
    assert not psutil.pid_exists(agent_pid) or psutil.Process(agent_pid).status() == psutil.STATUS_ZOMBIE
    assert not hanging(env.marker), "the agent's command outlived it"
    assert env.starts() == 1


async def test_scripted_attempt_is_recorded_once_and_labelled(env: Env) -> None:
    request = env.request(agent={"name": "scripted", "commands": ["echo 56.0 > speed.txt"]})
    async with env.worker():
        first = await env.run(Probe(request=request))
        again = await env.run(Probe(request=request))
    assert first.exit_reason is ExitReason.COMMITTED and first.agent.startswith("scripted (demo/test agent")
    assert first.usage.cost_usd is None and first.usage.cost_source == "unavailable"
    assert again == first, "a finished attempt is handed back from result.json, not run again"
    assert "scripted" in first.summary() and "cost unavailable" in first.summary()


async def test_prompt_carries_lessons_and_the_previous_failure(env: Env) -> None:
    request = env.request().model_copy(
        update={
            "brief": "gate decode failed: 28.9 < 55 (median of 5 runs)",
            "lessons": ["prefix caching breaks partial prefill (trap, 2026-07-12, ticket 3)"],
        }
    )
    script = env.use(ModelScript.of(Reply("nothing to do. RESULT: success")))
    async with env.worker():
        result = await env.run(Probe(request=request))
    prompt = json.dumps(script.first_request)
    assert "prefix caching breaks partial prefill" in prompt and "28.9 < 55" in prompt
    # The agent claimed success without a commit: verification, not trust.
    assert result.claimed_success is True and result.exit_reason is ExitReason.NO_COMMIT


async def test_commit_outside_allowed_paths_is_forbidden(env: Env) -> None:
    env.use(ModelScript.of(Shell("echo rogue >> README"), Reply("RESULT: success")))
    async with env.worker():
        result = await env.run(Probe(request=env.request(allowed_paths=["src"])))
    assert result.exit_reason is ExitReason.FORBIDDEN and "README" in result.detail and result.commit is None


async def test_allowed_paths_outside_the_worktree_are_a_clear_error(env: Env) -> None:
    async with env.worker():
        with pytest.raises(WorkflowFailureError) as failure:
            await env.run(Probe(request=env.request(allowed_paths=["../../etc"]), max_attempts=3))
    cause = failure.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
    assert "point outside the worktree" in str(cause.cause) and cause.cause.non_retryable
    assert env.starts() == 0
