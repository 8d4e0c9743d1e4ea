"""One interface for every coding agent, and the factory that picks the one a spec names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, assert_never

from daedalus.agents.base import Heartbeat
from daedalus.agents.settings import AgentSettings
from daedalus.schemas.agents import AgentResult, AgentTask
from daedalus.schemas.ticket import AgentName, AgentSpec


class CodingAgent(Protocol):
    """Runs one attempt in `task.worktree`; transcripts and usage go to `artifacts`, progress to `heartbeat`."""

    name: str
    label: str

    async def run(
        self,
        task: AgentTask,
        *,
        artifacts: Path,
        heartbeat: Heartbeat,
        keep_on_cancel: Callable[[], bool] = ...,
    ) -> AgentResult: ...


def agent_for(spec: AgentSpec, settings: AgentSettings) -> CodingAgent:
    """The agent a spec names. Imports are deferred: the SDKs cost seconds that a CLI start should not pay."""
    match spec.name:
        case AgentName.SCRIPTED:
            from daedalus.agents.scripted import ScriptedAgent

            return ScriptedAgent(settings)
        case AgentName.CODEX:
            from daedalus.agents.codex import CodexAgent

            return CodexAgent(settings)
        case AgentName.CLAUDE:
            from daedalus.agents.claude import ClaudeAgent

            return ClaudeAgent(settings)
        case AgentName.OPENAI:
            from daedalus.agents.openai_agent import OpenAIAgent

            return OpenAIAgent(settings)
        case AgentName.ANTHROPIC:
            from daedalus.agents.anthropic_agent import AnthropicAgent

            return AnthropicAgent(settings)
        case _:
            assert_never(spec.name)
