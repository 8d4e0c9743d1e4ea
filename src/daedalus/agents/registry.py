"""One interface for every coding agent, and the factory that picks the one a spec names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, assert_never

from daedalus.agents.anthropic_agent import AnthropicAgent
from daedalus.agents.base import Heartbeat
from daedalus.agents.claude import ClaudeAgent
from daedalus.agents.codex import CodexAgent
from daedalus.agents.openai_agent import OpenAIAgent
from daedalus.agents.scripted import ScriptedAgent
from daedalus.agents.settings import AgentSettings
from daedalus.schemas.agents import AgentResult, AgentTask
from daedalus.schemas.ticket import AgentName, AgentSpec


class CodingAgent(Protocol):
    """Runs one attempt in `task.worktree`; transcripts and usage go to `artifacts`, progress to `heartbeat`."""

    name: str
    label: str

    async def run(
        self, task: AgentTask, *, artifacts: Path, heartbeat: Heartbeat,
        keep_on_cancel: Callable[[], bool] = ...,
    ) -> AgentResult: ...


class AgentUnavailable(RuntimeError):
    pass


def agent_for(spec: AgentSpec, settings: AgentSettings | None = None) -> CodingAgent:
    settings = settings or AgentSettings()
    match spec.name:
        case AgentName.SCRIPTED:
            return ScriptedAgent()
        case AgentName.CODEX:
            return CodexAgent(settings)
        case AgentName.CLAUDE:
            return ClaudeAgent(settings)
        case AgentName.OPENAI:
            return OpenAIAgent(settings)
        case AgentName.ANTHROPIC:
            return AnthropicAgent(settings)
        case _:
            assert_never(spec.name)
