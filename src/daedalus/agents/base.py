"""What every agent shares: the heartbeat callback, the running-record (pidfile), and the result builder."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from daedalus.agents.costs import CostMeter
from daedalus.agents.settings import AgentSettings
from daedalus.agents.worktree import objects_dir
from daedalus.sandbox import Sandbox
from daedalus.schemas.agents import AgentResult, AgentTask, ExitReason

Heartbeat = Callable[..., None]

RUNNING_FILE = "running.json"
RESULT_FILE = "result.json"
USAGE_FILE = "usage.json"
EVENTS_FILE = "events.jsonl"
STDERR_FILE = "stderr.log"
TRANSCRIPT_FILE = "transcript.jsonl"


@dataclass(frozen=True)
class RunningRecord:
    """Who is running an attempt: the agent process itself (`process`) or the worker hosting it (`worker`)."""

    pid: int
    create_time: float
    kind: Literal["process", "worker"]
    agent: str
    started_at: float
    token: str | None = None  # the step token its processes carry (see daedalus.processes)

    @classmethod
    def of(
        cls, pid: int, *, kind: Literal["process", "worker"], agent: str, token: str | None = None
    ) -> RunningRecord:
        return cls(pid, psutil.Process(pid).create_time(), kind, agent, time.time(), token)

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> RunningRecord | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def alive(self) -> bool:
        """The same process (pid and start time: pids are reused) and not a zombie."""
        try:
            process = psutil.Process(self.pid)
            return abs(process.create_time() - self.create_time) < 0.05 and (
                process.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False


def command_sandbox(task: AgentTask, settings: AgentSettings) -> Sandbox:
    """Where an agent's commands run when the agent is not a program of its own (tool-loop shells, the scripted
    agent's commands): the task's worktree and branch, no network, no home, only the variables named in
    `sandbox_pass_env`."""
    passed = {name: os.environ[name] for name in settings.sandbox_pass_env if name in os.environ}
    return Sandbox.for_worktree(
        Path(task.worktree),
        objects=objects_dir(Path(task.repo)),
        read_only=settings.sandbox_read_only,
        writable=settings.sandbox_writable,
        env=passed,
        tmp_mib=task.limits.tmp_mib if task.limits is not None else None,
    )


class Throttle:
    """Call `heartbeat` at most every `every_s`, always with the latest progress."""

    def __init__(self, heartbeat: Heartbeat, every_s: float = 1.0):
        self.heartbeat = heartbeat
        self.every_s = every_s
        self.last = 0.0

    def __call__(self, progress: dict[str, Any], *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.every_s:
            self.last = now
            self.heartbeat(progress)


def make_result(
    task: AgentTask,
    *,
    label: str,
    reason: ExitReason,
    meter: CostMeter,
    transcript: Path,
    detail: str = "",
    claimed: bool | None = None,
    traps: list[str] | None = None,
    started: float | None = None,
) -> AgentResult:
    note = meter.budget_note()
    return AgentResult(
        ticket_id=task.ticket_id,
        attempt=task.attempt,
        agent=label,
        exit_reason=reason,
        branch=task.branch,
        transcript=str(transcript),
        usage=meter.usage(),
        claimed_success=claimed,
        traps=traps or [],
        detail="; ".join(x for x in (detail, note) if x)[:2000],
        duration_s=round(time.time() - started, 3) if started is not None else None,
        artifacts=str(transcript.parent),
    )
