"""The real Codex CLI and Claude Code, as `make agent-clis` installed them, against the local model server."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from daedalus.agents.cli import EGRESS_LOG, installed_clis_dir
from daedalus.agents.model_server import Action, EditFile, ModelScript, ModelServer, ReadFile, Reply, Shell
from daedalus.agents.settings import AgentSettings


def installed() -> Path:
    """The installed CLIs; a test that needs them fails (never skips) when they are missing."""
    where = installed_clis_dir()
    if where is None or not (where / ".installed").exists():
        pytest.fail(
            f"the Codex CLI and Claude Code are not installed in {where}: run `make agent-clis` "
            "(scripts/install_agent_clis.sh) with the same DAEDALUS_CACHE_DIR as the tests"
        )
    return where


def new_key() -> str:
    """An API key of its own for one agent run: the model server picks the run's script by it."""
    return f"test-{uuid.uuid4().hex[:16]}"


def cli_settings(server: ModelServer, key: str, **fields: Any) -> AgentSettings:
    """Both CLI agents pointed at the local model server with `key`; cost priced as if the endpoint were paid
    (so budgets are enforceable and the cost record has a figure), unless a test says otherwise."""
    installed()
    base: dict[str, Any] = {
        "openai_base_url": f"{server.url}/v1",
        "openai_api_key": key,
        "openai_priced": True,
        "anthropic_base_url": server.url,
        "anthropic_api_key": key,
        "anthropic_priced": True,
    }
    return AgentSettings(**{**base, **fields})


def egress_decisions(artifacts: Path) -> list[dict[str, Any]]:
    path = artifacts / EGRESS_LOG
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def the_change(name: str, to: str = "56.0") -> ModelScript:
    """The script of a CLI that reads speed.txt, edits it to `to`, runs a command that reads it back, and says so
    (Claude Code's Edit wants the file Read first)."""
    steps: list[Action] = [Shell("cat speed.txt"), EditFile("speed.txt", "28.9", to), Shell("cat speed.txt")]
    if name == "claude":
        steps.insert(1, ReadFile("speed.txt"))
    return ModelScript.of(*steps, Reply(f"Raised decode to {to} tok/s.\nRESULT: success"))


def hang(marker: str) -> str:
    """A command that never ends on its own (Claude Code refuses a standalone `sleep`), named by `marker`."""
    return f"timeout {marker} tail -f /dev/null"


def hanging(marker: str) -> list[int]:
    """Host pids of live processes whose command line holds `marker`."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if marker in (process.info["cmdline"] or []) and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process.pid)
    return found
