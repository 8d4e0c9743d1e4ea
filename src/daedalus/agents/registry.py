"""Pick the agent implementation a spec names."""

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from daedalus.agents.scripted import ScriptedAgent
from daedalus.schemas.agents import AgentResult, AgentTask
from daedalus.schemas.ticket import AgentName, AgentSpec


class CodingAgent(Protocol):
    name: str

    async def run(self, task: AgentTask, *, log_path: Path, heartbeat: Callable[[], None]) -> AgentResult: ...


class AgentUnavailable(RuntimeError):
    pass


def agent_for(spec: AgentSpec) -> CodingAgent:
    if spec.name is AgentName.SCRIPTED:
        return ScriptedAgent()
    raise AgentUnavailable(f"agent {spec.name.value!r} is not wired on this worker yet; use 'scripted'")
