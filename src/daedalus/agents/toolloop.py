"""Agents that are a loop in this worker (OpenAI, Anthropic): model call, tool calls in the worktree, repeat."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from daedalus.agents.base import (
    RUNNING_FILE,
    TRANSCRIPT_FILE,
    USAGE_FILE,
    Heartbeat,
    RunningRecord,
    command_sandbox,
    make_result,
)
from daedalus.agents.costs import CostMeter
from daedalus.agents.prompt import build_prompt, claimed_success, reported_traps
from daedalus.agents.settings import AgentSettings
from daedalus.agents.tools import Toolbox
from daedalus.errors import (
    AgentConfigError,
    AgentViolation,
    ApiFailure,
    BudgetExceeded,
    ForbiddenCommand,
    PathEscape,
    ToolError,
)
from daedalus.schemas.agents import AgentResult, AgentTask, ExitReason

log = structlog.get_logger(__name__)
MAX_REFUSALS = 3
SYSTEM = (
    "You are a careful coding agent working in one git worktree of an inference-engine repository. "
    "Use the tools to read, change and test the code; keep the change minimal; commit it with git when done."
)


class Transcript:
    """Everything said and done in the loop, one JSON object a line, in the artifact dir."""

    def __init__(self, path: Path):
        self.path = path
        self.events = 0

    def write(self, kind: str, **fields: Any) -> None:
        self.events += 1
        with self.path.open("a") as handle:
            handle.write(json.dumps({"t": round(time.time(), 3), "type": kind, **fields}, default=str) + "\n")


class ToolLoop:
    """The tools side of a loop: runs calls, records them, and ends the attempt after repeated refusals."""

    def __init__(self, toolbox: Toolbox, transcript: Transcript):
        self.toolbox = toolbox
        self.transcript = transcript
        self.refused: list[str] = []

    async def call(self, name: str, arguments: str | dict[str, Any]) -> tuple[str, bool]:
        """The tool's output (or error for the model) and whether it is an error."""
        try:
            output, is_error = await self.toolbox.call(name, arguments), False
        except (PathEscape, ForbiddenCommand) as error:
            self.refused.append(str(error))
            output, is_error = f"refused: {error}", True
        except ToolError as error:
            output, is_error = f"error: {error}", True
        self.transcript.write("tool", name=name, arguments=arguments, output=output[:4000], is_error=is_error)
        if len(self.refused) >= MAX_REFUSALS:
            raise AgentViolation(f"{len(self.refused)} tool calls refused; last: {self.refused[-1]}")
        return output, is_error


class ToolLoopAgent(ABC):
    name: str
    label: str

    def __init__(self, settings: AgentSettings):
        self.settings = settings

    @abstractmethod
    def model(self, task: AgentTask) -> str: ...

    def priced(self) -> bool:
        return True

    @abstractmethod
    def check_config(self, task: AgentTask) -> None:
        """Raise AgentConfigError naming the setting to fix."""

    @abstractmethod
    async def loop(self, task: AgentTask, prompt: str, meter: CostMeter, tools: ToolLoop) -> str | None:
        """Run the conversation to its end; returns the final text."""

    async def run(
        self,
        task: AgentTask,
        *,
        artifacts: Path,
        heartbeat: Heartbeat,
        keep_on_cancel: Callable[[], bool] = lambda: False,
    ) -> AgentResult:
        started = time.time()
        transcript = Transcript(artifacts / TRANSCRIPT_FILE)
        meter = CostMeter(
            model=self.model(task),
            budget_usd=task.agent.budget_usd,
            path=artifacts / USAGE_FILE,
            priced=self.priced(),
        )
        tools = ToolLoop(
            Toolbox(
                Path(task.worktree),
                deny=self.settings.deny_commands,
                shell_timeout_s=self.settings.shell_timeout_s,
                sandbox=command_sandbox(task, self.settings),
                limits=task.limits,
                cgroup_root=Path(task.cgroup_root) if task.cgroup_root else None,
            ),
            transcript,
        )

        def result(
            reason: ExitReason, detail: str, claimed: bool | None = None, traps: list[str] | None = None
        ) -> AgentResult:
            if tools.refused and reason is not ExitReason.FORBIDDEN:
                detail += f"; refused tool calls: {tools.refused}"
            transcript.write("end", reason=reason.value, detail=detail)
            return make_result(
                task,
                label=self.label,
                reason=reason,
                meter=meter,
                transcript=transcript.path,
                detail=detail,
                claimed=claimed,
                traps=traps,
                started=started,
            )

        try:
            self.check_config(task)
        except AgentConfigError as error:
            return result(ExitReason.FAILED, str(error))
        RunningRecord.of(os.getpid(), kind="worker", agent=self.name).write(artifacts / RUNNING_FILE)
        prompt = build_prompt(task)
        transcript.write("prompt", text=prompt)

        async def pulse() -> None:
            # Model calls and shell tools can be slow; the activity must still heartbeat with progress.
            while True:
                heartbeat({"events": transcript.events, "turns": meter.turns, "tokens": meter.output_tokens})
                await asyncio.sleep(1.0)

        ticker = asyncio.create_task(pulse())
        try:
            async with asyncio.timeout(task.timeout_s):
                final = await self.loop(task, prompt, meter, tools)
        except TimeoutError:
            return result(ExitReason.TIMEOUT, f"{self.name} ran past its {task.timeout_s}s limit")
        except BudgetExceeded as error:
            return result(ExitReason.BUDGET_EXCEEDED, str(error))
        except AgentViolation as error:
            return result(ExitReason.FORBIDDEN, str(error))
        except ApiFailure as error:
            return result(ExitReason.TIMEOUT if error.timed_out else ExitReason.FAILED, str(error))
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        if final is None:
            return result(
                ExitReason.FAILED, f"{self.name} hit the turn limit ({task.max_turns}) without finishing"
            )
        return result(
            ExitReason.COMMITTED,
            f"{self.name} finished in {meter.turns} turns",
            claimed=claimed_success(final),
            traps=reported_traps(final),
        )
