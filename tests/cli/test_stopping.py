"""A CLI command stopped with SIGTERM (or SIGHUP) leaves what it started as Ctrl-C does: `daedalus demo` killed
this way used to leave its embedded Temporal and a gate's measurement running."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest

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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_command_leaves_its_context_and_its_children(signum: signal.Signals) -> None:
    command = subprocess.Popen(
        [sys.executable, "-c", COMMAND], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert command.stdout is not None
    child = psutil.Process(int(command.stdout.readline()))
    command.send_signal(signum)
    _, stderr = command.communicate(timeout=30)
    assert command.returncode == 128 + signum, stderr
    assert f"stopped by {signum.name}" in stderr
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, "the command's child outlived it"
