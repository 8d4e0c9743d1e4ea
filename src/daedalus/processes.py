"""Child processes in their own process group: logged to a file, heartbeating, and killed whole on cancel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

TAIL_BYTES = 4000


@dataclass(frozen=True)
class Finished:
    returncode: int
    log_path: Path
    timed_out: bool

    def tail(self, limit: int = TAIL_BYTES) -> str:
        return log_tail(self.log_path, limit)


def log_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - limit))
        return handle.read().decode(errors="replace")


def group_members(pgid: int) -> list[psutil.Process]:
    """Live processes in process group `pgid` (zombies excluded)."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
    return members


def kill_group(pgid: int, grace_s: float = 3.0) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left after `grace_s` (blocking: call it in a
    thread from async code). `pgid` is the leader's pid (children start with start_new_session), so the group
    is reached even when the leader itself has already exited."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return  # nobody is left in the group
    _, alive = psutil.wait_procs(group_members(pgid), timeout=grace_s)
    if alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace_s)


STEP_TOKEN_ENV = "DAEDALUS_STEP_TOKEN"


def mark_step(path: Path) -> str:
    """Write a fresh token to `path` before a step starts; its processes carry it in their environment.

    Written before the spawn, so a worker killed at any moment after it leaves a trace; matched by environment,
    so a reused pid can never be mistaken for the step's.
    """
    token = uuid.uuid4().hex
    path.write_text(token)
    return token


def kill_leftover(path: Path) -> bool:
    """Kill every process group still running a step whose token `path` holds. True if any was found."""
    try:
        token = path.read_text().strip()
    except OSError:
        return False
    groups = set()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if proc.environ().get(STEP_TOKEN_ENV) == token:
                groups.add(os.getpgid(proc.pid))
    for group in groups:
        kill_group(group)
    path.unlink(missing_ok=True)
    return bool(groups)


async def run_logged(
    command: str,
    *,
    cwd: Path,
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    heartbeat: Callable[[], None] | None = None,
    heartbeat_every_s: float = 2.0,
    stdout_path: Path | None = None,
    pidfile: Path | None = None,
) -> Finished:
    """Run a shell command to completion in a new session, output appended to `log_path`.

    With `stdout_path`, stdout goes there and only stderr to the log (for commands whose stdout is data).
    Cancellation (an activity cancelled by Temporal) kills the whole process group before re-raising.
    With `pidfile` (a step marker, see `mark_step`), a group left running by a worker that died (SIGKILL
    leaves its session alive) is killed before the command starts again, so a retried step never runs
    beside its own ghost.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    if pidfile is not None:
        await asyncio.to_thread(kill_leftover, pidfile)
        full_env[STEP_TOKEN_ENV] = mark_step(pidfile)
    with log_path.open("ab") as log, stdout_path.open("wb") if stdout_path else log as out:
        process = await asyncio.create_subprocess_shell(
            command,
            cwd=cwd,
            env=full_env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=log,
            start_new_session=True,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                try:
                    returncode = await asyncio.wait_for(process.wait(), timeout=heartbeat_every_s)
                    # Whatever the command left running in the background (a server, a daemon) goes with it.
                    await asyncio.to_thread(kill_group, process.pid, 1.0)
                    if pidfile is not None:
                        pidfile.unlink(missing_ok=True)
                    return Finished(returncode, log_path, timed_out=False)
                except TimeoutError:
                    if heartbeat is not None:
                        heartbeat()
                    if loop.time() > deadline:
                        await asyncio.to_thread(kill_group, process.pid)
                        await process.wait()
                        return Finished(process.returncode or -9, log_path, timed_out=True)
        except BaseException:
            await asyncio.to_thread(kill_group, process.pid)
            await process.wait()
            if pidfile is not None:
                pidfile.unlink(missing_ok=True)
            raise
