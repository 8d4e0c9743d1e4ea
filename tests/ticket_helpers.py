"""Helpers for the ticket workflow tests that tests/support.py does not have (yet): audit reads, processes."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import Engine
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from daedalus.schemas import search_attributes as sa
from daedalus.schemas.ticket import DecisionRequest, TicketState, TicketStatus
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.store.tables import AuditEventRow
from daedalus.workflows.ticket import TicketWorkflow
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[1]
HISTORIES = ROOT / "tests" / "histories"


def host_of(task_queue: str) -> str:
    return f"h-{task_queue[-8:]}"


def events(engine: Engine, ticket_id: str) -> list[AuditEventRow]:
    with session_scope(engine) as session:
        return list(queries.audit_events(session=session, ticket_id=ticket_id))


def kinds(rows: Sequence[AuditEventRow]) -> list[str]:
    return [r.kind for r in rows]


async def pending(
    handle: WorkflowHandle[Any, TicketState], timeout: float = 60
) -> tuple[TicketState, DecisionRequest]:
    """Wait until the ticket asks its next decision; return its state and the request.

    The status query reports the ticket as its trail in the store shows it, so an answered request stays visible
    until its `decided` event is written: each call returns a request this helper has not returned before.
    """
    seen = _requests_returned.setdefault((handle.id, handle.result_run_id or handle.run_id), set())
    state = await wait_for(
        handle,
        lambda s: s.pending_decision is not None and s.pending_decision.id not in seen,
        timeout=timeout,
    )
    assert state.pending_decision is not None
    seen.add(state.pending_decision.id)
    return state, state.pending_decision


_requests_returned: dict[tuple[str, str | None], set[str]] = {}


async def asked_in_history(handle: WorkflowHandle[Any, TicketState], timeout: float = 30) -> None:
    """Wait until the workflow task that asked the pending decision is complete in Temporal's history: its status
    search attribute, set by that task, says the ticket waits. A query answers from the worker's state, which
    can be ahead of the history: a server stopped then retries that task after its restart, at a new workflow
    time, and the request it asks again carries that time."""
    deadline = asyncio.get_running_loop().time() + timeout
    waiting = {TicketStatus.AWAITING_APPROVAL.value, TicketStatus.AWAITING_DECISION.value}
    while (await handle.describe()).typed_search_attributes.get(sa.STATUS) not in waiting:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{handle.id}: the request's workflow task is not in the history")
        await asyncio.sleep(0.1)


async def started(client: Client, ticket_id: str, timeout: float = 60) -> WorkflowHandle[Any, TicketState]:
    """The handle of `ticket-<id>` once it exists (a child ticket starts only when its parent gets to it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            await client.get_workflow_handle(f"ticket-{ticket_id}").describe()
            return client.get_workflow_handle_for(TicketWorkflow.run, f"ticket-{ticket_id}")
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND or loop.time() > deadline:
                raise
        await asyncio.sleep(0.2)


def commit_all(repo: Path, message: str) -> None:
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message], cwd=repo, check=True
    )


def sleep_marker() -> int:
    """A `sleep` duration no other process on the machine is likely to use: it names our processes."""
    return random.randint(100_000, 999_999)


def sleepers(seconds: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if (proc.info["cmdline"] or [])[-1:] == [str(seconds)] and "sleep" in proc.info["cmdline"][0]:
                found.append(proc)
        except (psutil.NoSuchProcess, IndexError):
            continue
    return found


async def until_gone(seconds: int, timeout: float = 30) -> float:
    """Wait until no `sleep <seconds>` process is left; return how long that took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while sleepers(seconds):
        if loop.time() - start > timeout:
            left = [(p.pid, p.info["cmdline"]) for p in sleepers(seconds)]
            raise AssertionError(f"processes still alive after {timeout}s: {left}")
        await asyncio.sleep(0.2)
    return loop.time() - start


def worker_command(
    address: str, control_queue: str, host: str, tmp_path: Path, database_url: str | None
) -> list[str]:
    """`python -m tests.workflows.ticket_worker ...`: a real worker process the tests can SIGKILL."""
    command = [
        sys.executable,
        "-m",
        "tests.workflows.ticket_worker",
        address,
        control_queue,
        host,
        str(tmp_path),
    ]
    if database_url is not None:
        command += ["--database-url", database_url]
    return command


def start_worker_process(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start the worker and wait until it says it polls (so nothing is scheduled onto a worker still importing)."""
    handle = log.open("ab")
    process = subprocess.Popen(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    handle.close()
    return process


async def until_ready(
    process: subprocess.Popen[bytes], log: Path, times: int = 1, timeout: float = 60
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while log.read_text().count("worker ready") < times:
        if process.poll() is not None:
            raise AssertionError(f"worker exited {process.returncode}: {log.read_text()[-2000:]}")
        if loop.time() > deadline:
            raise AssertionError(f"worker not ready after {timeout}s: {log.read_text()[-2000:]}")
        await asyncio.sleep(0.1)
