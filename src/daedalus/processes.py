"""Child processes in their own process group: logged to a file, heartbeating, and killed whole on cancel."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import psutil

if TYPE_CHECKING:
    from daedalus.schemas.steps import ResourceLimits

TAIL_BYTES = 4000


class Confined(Protocol):
    """Where a command runs confined (daedalus.sandbox.Sandbox, which sits above this module): the command line
    that starts it there, and the whole environment it gets there."""

    def argv(self, command: Sequence[str], *, cwd: Path | None = None) -> list[str]: ...

    def environment(self, token: str) -> dict[str, str]: ...


PR_SET_PDEATHSIG = 1


def kill_me_with_parent(parent: int) -> Callable[[], None]:
    """A preexec hook (runs in the child before exec): SIGKILL when the parent dies; exit at once if it already has."""

    def hook() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return hook


@dataclass(frozen=True)
class Finished:
    returncode: int
    log_path: Path
    timed_out: bool
    limits_hit: tuple[str, ...] = ()
    """The resource limits the step ran into, as the kernel counted them (daedalus.confinement)."""
    unlimited: str | None = None
    """Why its processes and memory ran unlimited, when they did."""

    def tail(self, limit: int = TAIL_BYTES) -> str:
        return log_tail(self.log_path, limit)


LINES_TAIL_BYTES = 64 * 1024


def log_tail(path: Path, limit: int | None = None, *, lines: int | None = None, missing: str = "") -> str:
    """The end of a log or output file, the one tail helper: its last `limit` bytes (TAIL_BYTES by default; a
    file of gigabytes costs the reader no more), then of those its last `lines` lines when `lines` is given
    (read from the last LINES_TAIL_BYTES by default). `missing` when there is no file to read."""
    window = limit if limit is not None else (TAIL_BYTES if lines is None else LINES_TAIL_BYTES)
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - window))
            text = handle.read().decode(errors="replace")
    except OSError:
        return missing
    return text if lines is None else "\n".join(text.splitlines()[-lines:])


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


def step_token() -> str:
    """A fresh marker for one step: every process of the step carries it in its environment."""
    return uuid.uuid4().hex


def mark_step(path: Path) -> str:
    """Write a fresh token to `path` before a step starts; its processes carry it in their environment.

    Written before the spawn, so a worker killed at any moment after it leaves a trace; matched by environment,
    so a reused pid can never be mistaken for the step's.
    """
    token = step_token()
    path.write_text(token)
    return token


def marked(token: str) -> list[psutil.Process]:
    """Live processes whose environment carries step token `token`: `setsid` and `nohup` ones included, which
    leave the step's process group but keep the environment they were started with.

    Reads /proc/<pid>/environ as bytes (a zombie's is empty): psutil's parsed environ costs ~10x more, and
    every step pays this sweep when it ends."""
    needle = b"\0" + f"{STEP_TOKEN_ENV}={token}".encode() + b"\0"
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue  # gone, or not ours to read
        if needle in b"\0" + environ + b"\0":
            with contextlib.suppress(psutil.Error):
                found.append(psutil.Process(int(entry.name)))
    return found


def kill_marked(token: str, grace_s: float = 1.0) -> int:
    """SIGTERM every process of the step `token`, SIGKILL what is left after `grace_s` (blocking: call it in
    a thread from async code). Returns how many were found."""
    found = marked(token)
    for proc in found:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(found, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    # A process forked while we were killing carries the token too: one more pass catches it.
    late = marked(token)
    for proc in late:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(late, timeout=grace_s)
    return len(found)


def end_step(pgid: int, token: str, grace_s: float = 1.0) -> None:
    """Whatever a step left running goes with it: its process group, then everything carrying its token."""
    kill_group(pgid, grace_s)
    kill_marked(token, grace_s)


def kill_leftover(path: Path) -> bool:
    """Kill every process still running a step whose token `path` holds. True if any was found."""
    try:
        token = path.read_text().strip()
    except OSError:
        return False
    found = kill_marked(token, grace_s=3.0)
    path.unlink(missing_ok=True)
    return found > 0


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
    sandbox: Confined | None = None,
    limits: ResourceLimits | None = None,
    cgroup_root: Path | None = None,
    extension: Callable[[], float] | None = None,
) -> Finished:
    """Run a shell command to completion in a new session, output appended to `log_path`.

    With `stdout_path`, stdout goes there and only stderr to the log (for commands whose stdout is data).
    The step ends with none of its processes alive: its group and every process carrying its step token
    (`setsid`/`nohup` children too) are killed when the command exits, times out or is cancelled.
    With `pidfile` (a step marker, see `mark_step`), processes left running by a worker that died (SIGKILL
    leaves its session alive) are killed before the command starts again, so a retried step never runs
    beside its own ghost. With `sandbox`, the command runs inside it, with only the sandbox's environment
    (plus `env`) instead of the worker's. With `limits`, it runs under them (daedalus.confinement), in a cgroup
    of its own where the host has one to give (`cgroup_root`, else cgroup v1's). With `extension`, the
    deadline moves out by the seconds it returns, asked at each heartbeat (a gate's engine start-ups).
    """
    from daedalus.confinement import Confinement

    log_path.parent.mkdir(parents=True, exist_ok=True)
    if pidfile is not None:
        await asyncio.to_thread(kill_leftover, pidfile)
        token = mark_step(pidfile)
    else:
        token = step_token()
    if sandbox is None:
        argv = ["/bin/sh", "-c", command]
        full_env = {**os.environ, **(env or {}), STEP_TOKEN_ENV: token}
    else:
        argv = sandbox.argv(["/bin/sh", "-c", command], cwd=cwd)
        full_env = {**sandbox.environment(token), **(env or {})}
    confinement = Confinement.start(limits, cgroup_root) if limits is not None else None

    def finished(returncode: int, timed_out: bool) -> Finished:
        hits, unlimited = confinement.end() if confinement is not None else ([], None)
        return Finished(returncode, log_path, timed_out, limits_hit=tuple(hits), unlimited=unlimited)

    with log_path.open("ab") as log, stdout_path.open("wb") if stdout_path else log as out:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=full_env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=log,
                start_new_session=True,
                preexec_fn=confinement.preexec if confinement is not None else None,
            )
        except BaseException:
            if confinement is not None:
                confinement.end()
            raise
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                try:
                    returncode = await asyncio.wait_for(process.wait(), timeout=heartbeat_every_s)
                    # Whatever the command left running in the background (a server, a daemon) goes with it.
                    await asyncio.to_thread(end_step, process.pid, token)
                    if pidfile is not None:
                        pidfile.unlink(missing_ok=True)
                    return await asyncio.to_thread(finished, returncode, False)
                except TimeoutError:
                    if heartbeat is not None:
                        heartbeat()
                    if loop.time() > deadline + (extension() if extension is not None else 0.0):
                        await asyncio.to_thread(end_step, process.pid, token, 3.0)
                        await process.wait()
                        if pidfile is not None:
                            pidfile.unlink(missing_ok=True)
                        return await asyncio.to_thread(finished, process.returncode or -9, True)
        except BaseException:
            await asyncio.to_thread(end_step, process.pid, token, 3.0)
            await process.wait()
            if pidfile is not None:
                pidfile.unlink(missing_ok=True)
            if confinement is not None:
                await asyncio.to_thread(confinement.end)
            raise
