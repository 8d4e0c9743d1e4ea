"""A ticket survives its worker being SIGKILLed and its dev server being restarted; a failing build is evidence."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import psutil
from sqlalchemy import Engine
from temporalio.client import Client, WorkflowExecutionStatus

from daedalus import services as daedalus
from daedalus.devserver import DevServer
from daedalus.payloads import DATA_CONVERTER
from daedalus.ports import free_port
from daedalus.schemas.ticket import AttemptOutcome, Decision, TicketStatus
from daedalus.workflows.ticket import TicketWorkflow
from tests.support import make_engine_repo, running_workers, status_is, ticket_spec, wait_for
from tests.ticket_helpers import (
    asked_in_history,
    events,
    host_of,
    kinds,
    pending,
    start_worker_process,
    until_ready,
    worker_command,
)


async def test_worker_sigkilled_mid_build_resumes_on_a_new_worker(
    temporal_client: Client,
    temporal_server: DevServer,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    """The whole worker (workflows, audit, host steps) dies mid-build; a new one finishes the ticket.

    The build step's heartbeat timeout (20 s) is how Temporal learns the worker is gone, so this test waits that
    long. The build runs confined, writing only its checkout: it counts its starts there, and its sandbox dies
    with the worker that started it (nothing of it is left for the retry to find).
    """
    host = host_of(task_queue)
    ghost = f"sleep {random.randint(100_000, 999_999)}"  # only the first build runs it; unique on the machine
    build = (
        "echo started >> build-starts; if [ $(wc -l < build-starts) -eq 1 ]; then "
        + ghost
        + "; else sleep 1; fi"
    )
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, build={"command": build})
    command = worker_command(temporal_server.address, task_queue, host, tmp_path, str(sqlite_engine.url))
    log = tmp_path / "worker.log"
    first = start_worker_process(command, log)
    second = None
    try:
        await until_ready(first, log)
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        await wait_for(handle, lambda s: any(tmp_path.rglob("build-starts")))
        [starts] = tmp_path.rglob("build-starts")  # in the attempt's checkout
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        second = start_worker_process(command, log)
        await until_ready(second, log, times=2)
        final = await wait_for(handle, status_is(TicketStatus.PASSED), timeout=150)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(10)
    assert starts.read_text().splitlines() == ["started", "started"]  # the build ran again on the new worker
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ghost.split()]
    assert not leftovers, "the dead worker's build group was not killed before the retry"
    [attempt] = final.attempts
    assert attempt.outcome is AttemptOutcome.GATES_PASSED
    rows = events(sqlite_engine, spec.id)
    assert [r.seq for r in rows] == list(range(1, final.audit_seq + 1))  # one event per seq, none lost
    assert [r.summary for r in rows if r.kind == "build"] == ["attempt 1: build passed"]
    assert kinds(rows).count("attempt") == 1  # the agent was not dispatched twice


async def test_dev_server_restart_on_the_same_sqlite_file_keeps_the_ticket(
    sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"),
        host,
        approval={"dispatch_requires_approval": True, "deciders": ["wayne"]},
    )
    db_file, port = tmp_path / "t.db", free_port()
    with DevServer(db_file=db_file, port=port, ui_port=None) as server:
        client = await Client.connect(server.address, data_converter=DATA_CONVERTER)
        async with running_workers(client, sqlite_engine, tmp_path, task_queue, host):
            handle = await daedalus.file_ticket(client, spec, queue=task_queue)
            before, request = await pending(handle)
            await asked_in_history(handle)  # what a restart keeps is what the history holds
    assert server.process is not None and server.process.poll() is not None  # really stopped
    with DevServer(db_file=db_file, port=port, ui_port=None) as server:
        client = await Client.connect(server.address, data_converter=DATA_CONVERTER)
        async with running_workers(client, sqlite_engine, tmp_path, task_queue, host):
            after = await daedalus.status(client, spec.id)
            assert after.status is TicketStatus.AWAITING_APPROVAL
            assert after.pending_decision == request and after.audit_seq == before.audit_seq
            await daedalus.decide(
                client,
                Decision(request_id=request.id, option="approve", decided_by="wayne"),
                store=sqlite_engine,
            )
            final = await client.get_workflow_handle_for(TicketWorkflow.run, f"ticket-{spec.id}").result()
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    rows = events(sqlite_engine, spec.id)
    assert [r.seq for r in rows] == list(range(1, final.audit_seq + 1))
    assert {r.run_id for r in rows} == {handle.result_run_id}


async def test_failing_build_is_recorded_with_its_log_retried_then_escalated(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    build = "echo compiling; echo 'ggml-cuda/mtp.cu:212: error: no member named align_tax' >&2; exit 2"
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, build={"command": build}, max_attempts=3)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        state, request = await pending(handle)
        assert [a.outcome for a in state.attempts] == [AttemptOutcome.BUILD_FAILED] * 2
        for attempt in state.attempts:
            assert attempt.detail.startswith("build exited 2:")
            assert "mtp.cu:212: error: no member named align_tax" in attempt.detail
        assert "the same failure twice" in request.question
        assert "mtp.cu:212" in request.evidence[0] and "mtp.cu:212" in request.evidence[1]
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="fail", decided_by="wayne"),
            store=sqlite_engine,
        )
        final = await handle.result()
    assert final.status is TicketStatus.FAILED
    # The retry went back to the agent with the build's log tail.
    brief = (tmp_path / "artifacts" / "tickets" / spec.id / "attempt-2" / "prompt.md").read_text()
    assert (
        "Previous attempt 1 (build_failed)" in brief
        and "mtp.cu:212: error: no member named align_tax" in brief
    )
    builds = [r for r in events(sqlite_engine, spec.id) if r.kind == "build"]
    assert [b.summary for b in builds] == [f"attempt {n}: build failed (exit 2)" for n in (1, 2)]
    log = Path(builds[0].detail["log"])
    assert "compiling" in log.read_text() and "align_tax" in log.read_text()
    assert "gate" not in kinds(events(sqlite_engine, spec.id))  # a broken build is never measured
