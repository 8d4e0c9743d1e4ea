"""Fixtures for agent tests: an engine repo with a worktree, a task, the artifact dir, the local model server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from daedalus.agents import worktree as wt
from daedalus.agents.model_server import ModelServer
from daedalus.schemas.agents import AgentTask
from daedalus.schemas.ticket import AgentSpec
from tests.support import make_engine_repo

MakeTask = Callable[..., AgentTask]


@pytest.fixture
def make_task(tmp_path: Path) -> MakeTask:
    repo = make_engine_repo(tmp_path / "engine")
    counter = iter(range(1, 100))

    def make(agent: dict[str, Any], **overrides: Any) -> AgentTask:
        n = next(counter)
        worktree = tmp_path / "wt" / f"attempt-{n}"
        branch = wt.branch_name("t1", n)
        base = wt.prepare_worktree(repo=repo, base_commit="main", worktree=worktree, branch=branch)
        fields: dict[str, Any] = {
            "ticket_id": "t1",
            "attempt": n,
            "agent": AgentSpec.model_validate(agent),
            "brief": "previous attempt: decode 28.9 tok/s < 55",
            "repo": str(repo),
            "base_commit": base,
            "worktree": str(worktree),
            "branch": branch,
            "spec": "Make decode reach 55 tok/s.",
            "constraints": ["no new dependencies"],
            "lessons": ["sm70 has no fp8"],
            "engine": "toy",
            "timeout_s": 60,
            "idle_timeout_s": 20,
            **overrides,
        }
        return AgentTask(**fields)

    return make


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    path = tmp_path / "artifacts"
    path.mkdir()
    return path


class Beats:
    """Records heartbeats the way activity.heartbeat would receive them."""

    def __init__(self) -> None:
        self.details: list[Any] = []

    def __call__(self, *details: Any) -> None:
        self.details.append(details)


@pytest.fixture
def beats() -> Beats:
    return Beats()


@pytest.fixture(scope="session")
def model_server() -> Iterator[ModelServer]:
    """The local model server the real CLIs talk to (one per session; each run has its own key and script)."""
    with ModelServer() as server:
        yield server
