"""Claude Code: `claude -p --output-format stream-json --verbose` with turn and budget caps, prompt on stdin.

Events: system{subtype:init,model,session_id}, assistant{message{id,model,content[text|tool_use],usage}},
user{message{content[tool_result]}}, result{subtype,is_error,num_turns,total_cost_usd,usage,result}.
"""

from __future__ import annotations

from typing import Any

from daedalus.agents.cli import CliAgent, EventParser
from daedalus.agents.costs import CostMeter
from daedalus.agents.tools import Toolbox
from daedalus.errors import BudgetExceeded
from daedalus.schemas.agents import AgentTask

WRITE_TOOLS = {"Write", "Edit", "MultiEdit", "NotebookEdit"}


class ClaudeParser(EventParser):
    def __init__(self, task: AgentTask, meter: CostMeter, toolbox: Toolbox):
        super().__init__(task, meter, toolbox)
        self.session_id: str | None = None
        # One message can arrive in several assistant events carrying the same usage: count it once.
        self.per_message: dict[str, tuple[int, int, int]] = {}

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "system" and event.get("subtype") == "init":
            self.session_id = event.get("session_id")
            if event.get("model"):
                self.meter.model = self.meter.model or str(event["model"])
        elif kind == "assistant":
            self._assistant(event.get("message") or {})
        elif kind == "result":
            self._result(event)

    def _assistant(self, message: dict[str, Any]) -> None:
        usage = message.get("usage") or {}
        if usage:
            cached = int(usage.get("cache_read_input_tokens") or 0)
            total_in = (
                int(usage.get("input_tokens") or 0)
                + cached
                + int(usage.get("cache_creation_input_tokens") or 0)
            )
            self.per_message[str(message.get("id", len(self.per_message)))] = (
                total_in,
                int(usage.get("output_tokens") or 0),
                cached,
            )
            self.meter.model = self.meter.model or message.get("model")
            self.meter.turns = len(self.per_message)
            self.meter.set_totals(
                input_tokens=sum(v[0] for v in self.per_message.values()),
                output_tokens=sum(v[1] for v in self.per_message.values()),
                cached_input_tokens=sum(v[2] for v in self.per_message.values()),
            )
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                self.final_text = str(block.get("text", ""))
            elif block.get("type") == "tool_use":
                tool_input = block.get("input") or {}
                if block.get("name") == "Bash" and tool_input.get("command"):
                    self.check_command(str(tool_input["command"]))
                elif block.get("name") in WRITE_TOOLS:
                    self.check_path(str(tool_input.get("file_path") or tool_input.get("notebook_path") or ""))

    def _result(self, event: dict[str, Any]) -> None:
        subtype = str(event.get("subtype", ""))
        usage = event.get("usage") or {}
        if event.get("total_cost_usd") is not None:
            self.meter.provider_cost = float(event["total_cost_usd"])
        if event.get("num_turns") is not None:
            self.meter.turns = int(event["num_turns"])
        if usage:
            cached = int(usage.get("cache_read_input_tokens") or 0)
            self.meter.set_totals(
                input_tokens=int(usage.get("input_tokens") or 0)
                + cached
                + int(usage.get("cache_creation_input_tokens") or 0),
                output_tokens=int(usage.get("output_tokens") or 0),
                cached_input_tokens=cached,
            )
        else:
            self.meter.set_totals(
                input_tokens=self.meter.input_tokens,
                output_tokens=self.meter.output_tokens,
                cached_input_tokens=self.meter.cached_input_tokens,
            )
        if isinstance(event.get("result"), str):
            self.final_text = event["result"]
        if subtype == "success" and not event.get("is_error"):
            self.claimed = None  # read the RESULT line of the final text
        elif "budget" in subtype:
            raise BudgetExceeded(f"claude stopped at its budget cap ({subtype})")
        else:
            self.claimed = False
            self.error = f"{subtype or 'error'}" + (
                f" after {event.get('num_turns')} turns" if subtype else ""
            )


class ClaudeAgent(CliAgent):
    name = "claude"
    label = "claude (Claude Code, `claude -p --output-format stream-json`)"

    def argv(self, task: AgentTask) -> list[str]:
        argv = [
            self.settings.claude_bin,
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--max-turns",
            str(task.max_turns),
            *self.settings.claude_args,
        ]
        if task.agent.model:
            argv += ["--model", task.agent.model]
        if task.agent.budget_usd is not None and self.settings.claude_budget_flag:
            argv += ["--max-budget-usd", f"{task.agent.budget_usd:.2f}"]
        return argv

    def provider_env(self) -> dict[str, str]:
        env = {}
        if self.settings.anthropic_api_key is not None:
            env["ANTHROPIC_API_KEY"] = self.settings.anthropic_api_key.get_secret_value()
        if self.settings.anthropic_base_url:
            env["ANTHROPIC_BASE_URL"] = self.settings.anthropic_base_url
        return env

    def parser(self, task: AgentTask, meter: CostMeter, toolbox: Toolbox) -> EventParser:
        return ClaudeParser(task, meter, toolbox)
