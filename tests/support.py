"""Helpers shared by tests: a local engine repo, ticket specs, and workers on per-test queues."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from temporalio.client import Client, WorkflowHandle

from daedalus.agents.settings import AgentSettings
from daedalus.confinement import StepSettings
from daedalus.schemas.ticket import TicketInput, TicketSpec, TicketState, TicketStatus
from daedalus.slack.settings import SlackSettings
from daedalus.store.seals import AuditKey
from daedalus.worker import WorkerConfig, build_workers
from daedalus.workflows.ticket import TicketWorkflow

FIXTURES = Path(__file__).parent / "fixtures"
EMIT = FIXTURES / "emit_samples.py"
TEST_STEPS = StepSettings(read_only=[FIXTURES])
"""Builds and gates run confined: the tests' gate and build commands run scripts from tests/fixtures."""
TEST_AUDIT_KEY = AuditKey(bytes(range(32)))
"""The audit key the tests' workers seal with (a store's key lives outside it; here, in the test code)."""

SPEED_PATCH = """\
--- a/speed.txt
+++ b/speed.txt
@@ -1 +1 @@
-28.9
+56.0
"""


SLOW_PATCH = "--- a/speed.txt\n+++ b/speed.txt\n@@ -1 +1 @@\n-28.9\n+40.0\n"
"""A patch that makes the decode gate FAIL (40 tok/s against a 55 tok/s threshold)."""


def make_engine_repo(path: Path, speed: str = "28.9") -> Path:
    """A small git repo standing in for an engine fork: `speed.txt` is what the gates measure."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "speed.txt").write_text(f"{speed}\n")
    (path / "README").write_text("toy engine\n")
    for command in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base"],
    ):
        subprocess.run(command, cwd=path, check=True)
    return path


def gate_command(extra: str = "") -> str:
    return f"{sys.executable} {EMIT} speed.txt {extra}".strip()


def ticket_spec(repo: Path, host: str, **overrides: Any) -> TicketSpec:
    base: dict[str, Any] = {
        "id": f"t{uuid.uuid4().hex[:8]}",
        "title": "MTP align tax fix (test)",
        "kind": "fix",
        "engine": {"name": "toy", "kind": "llama_cpp", "repo": str(repo), "base_commit": "main"},
        "host": host,
        "agent": {"name": "scripted", "patch": SPEED_PATCH},
        "spec": "Make single-user decode reach 55 tok/s.",
        "build": {"command": "test -f speed.txt"},
        "gates": [{"name": "decode", "metric": "decode_tps", "threshold": 55, "command": gate_command()}],
        "approval": {"dispatch_requires_approval": False},
        "max_attempts": 2,
    }
    base.update(overrides)
    return TicketSpec.model_validate(base)


def failing_spec(tmp_path: Path, host: str, *, max_attempts: int) -> TicketSpec:
    """A ticket whose every attempt commits a patch that fails the decode gate."""
    return ticket_spec(
        make_engine_repo(tmp_path / "repo"),
        host,
        agent={"name": "scripted", "patch": SLOW_PATCH},
        max_attempts=max_attempts,
    )


@asynccontextmanager
async def running_workers(
    client: Client,
    engine: Engine | None,
    tmp_path: Path,
    control_queue: str,
    host: str,
    slack: SlackSettings | None = None,
    agent: AgentSettings | None = None,
    sandboxed: bool = True,
    hosts_file: Path | None = None,
) -> AsyncIterator[None]:
    config = WorkerConfig(
        steps=TEST_STEPS,
        audit_key=TEST_AUDIT_KEY,
        sandboxed=sandboxed,
        hosts_file=hosts_file,
        slack=slack or SlackSettings(),
        agent=agent or AgentSettings(),
        control_queue=control_queue,
        hosts=[host],
        workspace_root=tmp_path / "ws",
        artifacts=tmp_path / "artifacts",
        fail_workflows_on_bugs=True,
    )
    workers = build_workers(client, config, engine)
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield
    finally:
        await asyncio.gather(*(w.shutdown() for w in workers))
        await asyncio.gather(*tasks, return_exceptions=True)


async def start_ticket(client: Client, spec: TicketSpec, queue: str) -> WorkflowHandle[Any, TicketState]:
    return await client.start_workflow(
        TicketWorkflow.run, TicketInput(spec=spec, filed_by="test"), id=f"ticket-{spec.id}", task_queue=queue
    )


async def wait_for(
    handle: WorkflowHandle[Any, TicketState], predicate: Callable[[TicketState], bool], timeout: float = 60
) -> TicketState:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        state = await handle.query(TicketWorkflow.state)
        if predicate(state):
            return state
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out; last state {state.status} pending={state.pending_decision}")
        await asyncio.sleep(0.2)


def status_is(*statuses: TicketStatus) -> Callable[[TicketState], bool]:
    return lambda state: state.status in statuses


def unique_sleep() -> str:
    """A `sleep` argument no other process on this shared machine uses: a step's child is found by its command
    line, since the pid it sees inside its sandbox's pid namespace means nothing outside."""
    return f"300.{uuid.uuid4().int % 10**9:09d}"


def sleeping(seconds: str) -> list[int]:
    """Host pids of live `sleep <seconds>` processes."""
    import psutil

    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if p.info["cmdline"] == ["sleep", seconds] and p.info["status"] != psutil.STATUS_ZOMBIE
    ]
