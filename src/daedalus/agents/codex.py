"""Codex CLI: `codex exec --json -` in the worktree, the prompt on stdin, events as JSONL on stdout.

Events (codex exec --json): thread.started{thread_id}, turn.started, item.started/updated/completed{item},
turn.completed{usage{input_tokens,cached_input_tokens,output_tokens}}, turn.failed{error{message}}, error{message}.
Items: agent_message{text}, reasoning, command_execution{command,exit_code,status}, file_change{changes[{path,kind}]}.
"""

from __future__ import annotations

from typing import Any

from daedalus.agents.cli import CliAgent, EventParser
from daedalus.agents.costs import CostMeter
from daedalus.agents.tools import Toolbox
from daedalus.schemas.agents import AgentTask


class CodexParser(EventParser):
    def __init__(self, task: AgentTask, meter: CostMeter, toolbox: Toolbox):
        super().__init__(task, meter, toolbox)
        self.thread_id: str | None = None
        self.commands = 0

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "thread.started":
            self.thread_id = event.get("thread_id")
        elif kind in ("turn.completed", "turn.failed"):
            usage = event.get("usage")
            if usage:
                self.meter.add(
                    input_tokens=int(usage.get("input_tokens", 0)),
                    output_tokens=int(usage.get("output_tokens", 0)),
                    cached_input_tokens=int(usage.get("cached_input_tokens", 0)),
                    turns=1,
                )
            if kind == "turn.failed":
                self.error = str((event.get("error") or {}).get("message", "turn failed"))
        elif kind == "error":
            self.error = str(event.get("message", "error"))
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


class CodexAgent(CliAgent):
    name = "codex"
    label = "codex (Codex CLI, `codex exec --json`)"

    def argv(self, task: AgentTask) -> list[str]:
        argv = [self.settings.codex_bin, "exec", "--json", *self.settings.codex_args, "-C", task.worktree]
        if task.agent.model:
            argv += ["-m", task.agent.model]
        return [*argv, "-"]

    def provider_env(self) -> dict[str, str]:
        env = {}
        if self.settings.openai_api_key is not None:
            env["OPENAI_API_KEY"] = self.settings.openai_api_key.get_secret_value()
            env["CODEX_API_KEY"] = env["OPENAI_API_KEY"]
        if self.settings.openai_base_url:
            env["OPENAI_BASE_URL"] = self.settings.openai_base_url
        return env

    def parser(self, task: AgentTask, meter: CostMeter, toolbox: Toolbox) -> EventParser:
        return CodexParser(task, meter, toolbox)
