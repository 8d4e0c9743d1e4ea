"""A CLI command stopped with SIGTERM (or SIGHUP) leaves what it started as Ctrl-C does: `daedalus demo` killed
this way used to leave its embedded Temporal and a gate's measurement running. A command, and `daedalus worker`,
stop on SIGINT even when started with SIGINT ignored (a background job of a non-interactive shell)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.cli.test_ticket_cli import DAEDALUS

COMMAND = """
import asyncio, contextlib
from daedalus.cli._common import run

@contextlib.asynccontextmanager
async def a_server():
    child = await asyncio.create_subprocess_exec("sleep", "600")
    try:
        yield child
    finally:
        child.kill()
        await child.wait()

async def main():
    async with a_server() as child:
        print(child.pid, flush=True)
        await asyncio.sleep(600)

run(main())
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `cmd &` in a script starts it


@pytest.mark.parametrize(
    ("signum", "started"),
    [(signal.SIGTERM, None), (signal.SIGHUP, None), (signal.SIGINT, _ignore_sigint)],
    ids=["SIGTERM", "SIGHUP", "SIGINT-inherited-ignored"],
)
def test_a_stopped_command_leaves_its_context_and_its_children(
    signum: signal.Signals, started: Callable[[], None] | None
) -> None:
    command = subprocess.Popen(
        [sys.executable, "-c", COMMAND], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=started,
    )  # fmt: skip
    assert command.stdout is not None
    child = psutil.Process(int(command.stdout.readline()))
    try:
        command.send_signal(signum)
        _, stderr = command.communicate(timeout=30)
        assert command.returncode == 128 + signum, stderr
        assert f"stopped by {signum.name}" in stderr
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, (
            "the command's child outlived it"
        )
    finally:
        for process in (command, child):
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                process.kill()


def test_a_worker_started_with_sigint_ignored_still_stops_on_it(
    cli_env: dict[str, str], task_queue: str, tmp_path: Path
) -> None:
    """What `cmd &` in a script (and a CI runner that starts its job that way) hands down: SIGINT ignored. Python
    then never raises KeyboardInterrupt, and this worker used to keep running after `kill -INT` for good."""
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [DAEDALUS, "worker", "--control", "--host", f"cli-{task_queue[-8:]}"], env=cli_env,
            stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "workers started" not in log.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        worker.send_signal(signal.SIGINT)
        assert worker.wait(30) == 0, log.read_text()
        assert log.read_text().rstrip().endswith("stopped")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
