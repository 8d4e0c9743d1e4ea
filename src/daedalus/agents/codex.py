"""Codex CLI: `codex exec --json -` in the worktree, the prompt on stdin, events as JSONL on stdout.

Daedalus writes `$CODEX_HOME/config.toml` (the home is the attempt's own): the model, a provider whose
`base_url` is the endpoint as the sandbox reaches it (`wire_api = "responses"`, the key from OPENAI_API_KEY),
`approval_policy = "never"` and `sandbox_mode = "danger-full-access"`: confinement is Daedalus's bubblewrap
sandbox, not Codex's own.

Events (codex-cli 0.169, recorded in tests/agents/fixtures/codex-*.jsonl): thread.started{thread_id},
turn.started, item.started/item.completed{item}, turn.completed{usage{input_tokens, cached_input_tokens,
cache_write_input_tokens, output_tokens, reasoning_output_tokens}}, turn.failed{error{message}}, error{message}.
Items: agent_message{text}, reasoning{text}, command_execution{command, aggregated_output, exit_code, status},
file_change{changes[{path, kind}], status}, error{message} (a warning, such as unknown model metadata).
Usage arrives on stdout only when the turn ends; while it runs, the session's rollout file in the home
(`sessions/**/rollout-*.jsonl`, `event_msg` of type `token_count` after every model response) carries the
running totals, so a budget is enforced mid-turn.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from daedalus.agents.cli import CliAgent, EventParser
from daedalus.agents.costs import CostMeter
from daedalus.agents.tools import Toolbox
from daedalus.errors import AgentConfigError
from daedalus.sandbox import HOME
from daedalus.schemas.agents import AgentTask

OPENAI_URL = "https://api.openai.com/v1"
CODEX_HOME = ".codex"
ROLLOUT_GLOB_S = 0.25


def _toml(value: str | bool) -> str:
    # A JSON string is a valid TOML basic string (the same escapes).
    return json.dumps(value)


class CodexParser(EventParser):
    def __init__(self, task: AgentTask, meter: CostMeter, toolbox: Toolbox, home: Path):
        super().__init__(task, meter, toolbox, home)
        self.thread_id: str | None = None
        self.commands = 0
        self.warnings: list[str] = []
        self.turn_totals = (0, 0, 0)
        self.turn_completed = False
        self.last_error: str | None = None
        self.responses = 0
        self._rollout: IO[bytes] | None = None
        self._rollout_buffer = b""
        self._next_glob = 0.0

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "thread.started":
            self.thread_id = event.get("thread_id")
        elif kind == "turn.completed":
            self.turn_completed = True
            usage = event.get("usage") or {}
            inp, out, cached = self.turn_totals
            self.turn_totals = (
                inp + int(usage.get("input_tokens") or 0),
                out + int(usage.get("output_tokens") or 0),
                cached + int(usage.get("cached_input_tokens") or 0),
            )
            self.meter.turns = max(self.meter.turns, self.responses, 1)
            self.meter.set_totals(
                input_tokens=self.turn_totals[0],
                output_tokens=self.turn_totals[1],
                cached_input_tokens=self.turn_totals[2],
            )
        elif kind == "turn.failed":
            self.error = str((event.get("error") or {}).get("message", "turn failed"))
        elif kind == "error":
            self.last_error = str(event.get("message", "error"))
        elif kind in ("item.started", "item.completed"):
            self._item(event.get("item") or {})

    def _item(self, item: dict[str, Any]) -> None:
        kind = item.get("type") or item.get("item_type")
        if kind == "command_execution" and item.get("command"):
            self.commands += 1
            self.check_command(str(item["command"]))
        elif kind == "file_change":
            for change in item.get("changes") or []:
                self.check_path(str(change.get("path", "")))
        elif kind == "agent_message" and item.get("text"):
            self.final_text = str(item["text"])
        elif kind == "error" and item.get("message"):
            self.warnings.append(str(item["message"]))

    def poll(self) -> None:
        """Running usage from the session's rollout file (Codex prints usage only when its turn ends)."""
        if self._rollout is None:
            now = time.monotonic()
            if now < self._next_glob:
                return
            self._next_glob = now + ROLLOUT_GLOB_S
            found = sorted((self.home / CODEX_HOME / "sessions").glob("**/rollout-*.jsonl"))
            if not found:
                return
            self._rollout = found[-1].open("rb")
        chunk = self._rollout.read()
        if not chunk:
            return
        self._rollout_buffer += chunk
        *lines, self._rollout_buffer = self._rollout_buffer.split(b"\n")
        for line in lines:
            self._rollout_line(line)

    def _rollout_line(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return
        payload = record.get("payload") if isinstance(record, dict) else None
        if not isinstance(payload, dict) or payload.get("type") != "token_count":
            return
        total = (payload.get("info") or {}).get("total_token_usage") or {}
        if not total:
            return
        self.responses += 1
        self.meter.turns = max(self.meter.turns, self.responses)
        if self.turn_completed:
            return  # the turn's own totals are in
        self.meter.set_totals(
            input_tokens=int(total.get("input_tokens") or 0),
            output_tokens=int(total.get("output_tokens") or 0),
            cached_input_tokens=int(total.get("cached_input_tokens") or 0),
        )

    def finish(self) -> str | None:
        if self._rollout is not None:
            self._rollout.close()
        if self.error:
            return self.error
        return None if self.turn_completed else self.last_error


class CodexAgent(CliAgent):
    name = "codex"
    label = "codex (Codex CLI, `codex exec --json`)"

    def configured_binary(self) -> str:
        return self.settings.codex_bin

    def model(self, task: AgentTask) -> str:
        return task.agent.model or self.settings.openai_model

    def endpoint(self) -> str:
        return self.settings.openai_base_url or OPENAI_URL

    def priced(self) -> bool:
        if self.settings.openai_priced is not None:
            return self.settings.openai_priced
        return urlsplit(self.endpoint()).hostname == "api.openai.com"

    def args(self, task: AgentTask) -> list[str]:
        return ["exec", "--json", *self.settings.codex_args, "-C", task.worktree, "-m", self.model(task), "-"]

    def provider_env(self, base_url: str) -> dict[str, str]:
        if self.settings.openai_api_key is None:
            raise AgentConfigError(
                "no OpenAI API key for the codex agent on this worker: set DAEDALUS_AGENT_OPENAI_API_KEY "
                "(or OPENAI_API_KEY); for a local endpoint that needs none, set any placeholder such as 'local'"
            )
        return {
            "OPENAI_API_KEY": self.settings.openai_api_key.get_secret_value(),
            "CODEX_HOME": f"{HOME}/{CODEX_HOME}",
        }

    def configure(self, task: AgentTask, home: Path, base_url: str) -> None:
        (home / CODEX_HOME).mkdir(parents=True, exist_ok=True)
        lines = [
            f"model = {_toml(self.model(task))}",
            'model_provider = "daedalus"',
            "# Confinement is Daedalus's sandbox (bubblewrap, egress to the model only), not Codex's own.",
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "",
            "[model_providers.daedalus]",
            'name = "the endpoint Daedalus configured"',
            f"base_url = {_toml(base_url)}",
            'env_key = "OPENAI_API_KEY"',
            'wire_api = "responses"',
            "",
            "[features]",
            "# Codex syncs a plugin catalogue from GitHub at start; the sandbox cannot reach it, so do not ask.",
            "plugins = false",
        ]
        (home / CODEX_HOME / "config.toml").write_text("\n".join(lines) + "\n")

    def parser(self, task: AgentTask, meter: CostMeter, toolbox: Toolbox, home: Path) -> EventParser:
        return CodexParser(task, meter, toolbox, home)
