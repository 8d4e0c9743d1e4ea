"""An engine's child processes, each in its own process group: its server (GroupProcess, started, logged and
killed as a whole group) and its tools run to completion (run_teed). A workflow step's processes (confined,
heartbeating, step tokens) are daedalus.processes'."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import structlog

from daedalus.errors import EngineError
from daedalus.processes import kill_group

log = structlog.get_logger(__name__)


class GroupProcess:
    """A long-running child (a server) in its own session, its output appended to a log file."""

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        memory_limit_bytes: int | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env or {})
        self.memory_limit_bytes = memory_limit_bytes
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            # A new session makes the child a group leader, so stop() reaches every descendant.
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
                preexec_fn=self._limit_memory if self.memory_limit_bytes else None,
            )
        log.info("process.started", pid=self._popen.pid, argv=self.argv[:3], log=str(self.log_path))

    def _limit_memory(self) -> None:
        # An address-space cap stands in for a GPU's fixed memory: past it, allocation fails as an OOM would.
        assert self.memory_limit_bytes is not None
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_limit_bytes, self.memory_limit_bytes))

    @property
    def pid(self) -> int:
        if self._popen is None:
            raise EngineError("the process was never started")
        return self._popen.pid

    def returncode(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def exit_code_within(self, seconds: float) -> int | None:
        """The exit code if the process ends within `seconds` (at once if it already has), else None. A killed
        server closes its sockets before it can be reaped, so a client can see refused connections a moment
        before poll() sees the death."""
        if self._popen is None:
            return None
        try:
            return self._popen.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def stop(self, grace_s: float = 5.0) -> int | None:
        """Kill the whole process group and reap the leader; returns its exit code."""
        if self._popen is None:
            return None
        kill_group(self._popen.pid, grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=grace_s)
        return self._popen.returncode


async def run_teed(
    argv: Sequence[str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> int:
    """Run an engine tool (argv, no shell) to completion in its own process group, teeing each line to `log_path`
    and to `on_line`; returns its exit code. Workflow steps run through daedalus.processes.run_logged instead
    (a shell command, confined, heartbeating, with a deadline).

    Cancellation (an activity cancelled, a Ctrl-C) kills the whole group before re-raising.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        with log_path.open("ab") as out:
            async for raw in proc.stdout:
                out.write(raw)
                out.flush()
                if on_line is not None:
                    on_line(raw.decode(errors="replace").rstrip("\n"))
        return await proc.wait()
    except BaseException:
        await asyncio.to_thread(kill_group, proc.pid)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()
        raise
