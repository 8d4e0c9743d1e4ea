"""The embedded dev server dies with the process that started it when asked to, even when that process is
SIGKILLed (a test session killed from outside must not leave its server running)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

STARTER = """
import sys, time
from daedalus.devserver import DevServer
from daedalus.ports import free_port
server = DevServer(db_file=None, port=free_port(), ui_port=None, die_with_parent={die}).start()
print(server.process.pid, flush=True)
time.sleep(600)
"""


def _start_and_kill_starter(die_with_parent: bool) -> psutil.Process:
    """Run a starter that brings up a server, SIGKILL the starter, and return the server's process."""
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER.format(die=die_with_parent)], stdout=subprocess.PIPE, text=True
    )
    assert starter.stdout is not None
    server = psutil.Process(int(starter.stdout.readline()))
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    return server


def _gone_within(process: psutil.Process, seconds: float) -> bool:
    try:
        process.wait(seconds)
    except psutil.TimeoutExpired:
        return False
    return True


def test_a_server_that_dies_with_its_parent_is_gone_when_the_parent_is_killed() -> None:
    server = _start_and_kill_starter(die_with_parent=True)
    assert _gone_within(server, 10), f"dev server {server.pid} outlived its SIGKILLed parent"


def test_without_it_a_killed_parent_leaves_its_server_running() -> None:
    """The control: the server has a process group of its own, so only the kernel's death signal reaps it."""
    server = _start_and_kill_starter(die_with_parent=False)
    try:
        assert not _gone_within(server, 2), "the server died with its parent although nobody asked it to"
    finally:
        os.killpg(os.getpgid(server.pid), signal.SIGKILL)
        _gone_within(server, 10)
