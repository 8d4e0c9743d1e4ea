"""`daedalus up` as a person runs it: the embedded server on a SQLite file, workers, a clean Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from daedalus import client as tickets
from daedalus.ports import free_port, port_is_open
from daedalus.schemas.ticket import Decision, TicketStatus
from daedalus.workflows.ticket import TicketWorkflow
from tests.support import make_engine_repo, ticket_spec

DAEDALUS = str(Path(sys.executable).parent / "daedalus")


def start_up(env: dict[str, str], port: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [DAEDALUS, "up", "--host", "uphost"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not port_is_open(port):
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        assert time.monotonic() < deadline, "daedalus up did not open its port"
        time.sleep(0.2)
    return process


def stop_up(process: subprocess.Popen[str], signum: signal.Signals = signal.SIGINT) -> str:
    children = psutil.Process(process.pid).children(recursive=True)
    assert children, "the embedded Temporal runs as a child of daedalus up"
    process.send_signal(signum)
    output, _ = process.communicate(timeout=60)
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {alive}"
    return output


def up_env(tmp_path: Path, port: int, ui_port: int) -> dict[str, str]:
    return {
        **os.environ,
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "DAEDALUS_TEMPORAL_PORT": str(port),
        "DAEDALUS_UI_PORT": str(ui_port),
    }


def test_sigterm_stops_everything_as_ctrl_c_does(tmp_path: Path) -> None:
    port, ui_port = free_port(), free_port()
    process = start_up(up_env(tmp_path, port, ui_port), port)
    output = stop_up(process, signal.SIGTERM)
    assert process.returncode == 0 and "stopped" in output, output
    assert not port_is_open(port) and not port_is_open(ui_port)


async def test_up_serves_tickets_and_keeps_them_across_a_restart(tmp_path: Path) -> None:
    port, ui_port = free_port(), free_port()
    env = up_env(tmp_path, port, ui_port)
    process = start_up(env, port)
    try:
        client = await tickets.connect(f"127.0.0.1:{port}")
        spec = ticket_spec(make_engine_repo(tmp_path / "repo"), "uphost", approval={"deciders": ["wayne"]})
        await tickets.file_ticket(client, spec, queue="daedalus-control")
        deadline = time.monotonic() + 30
        while (await tickets.status(client, spec.id)).status is not TicketStatus.AWAITING_APPROVAL:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        assert port_is_open(ui_port)
    finally:
        output = stop_up(process)
    assert "Temporal UI" in output and not port_is_open(port)
    assert (tmp_path / "home" / "temporal.db").exists() and (tmp_path / "home" / "daedalus.db").exists()

    process = start_up(env, port)
    try:
        client = await tickets.connect(f"127.0.0.1:{port}")
        state = await tickets.status(client, spec.id)
        assert state.pending_decision is not None
        await tickets.decide(
            client, Decision(request_id=state.pending_decision.id, option="approve", decided_by="wayne")
        )
        handle = client.get_workflow_handle_for(TicketWorkflow.run, tickets.workflow_id(spec.id))
        final = await handle.result()
        assert final.status is TicketStatus.PASSED
    finally:
        stop_up(process)
