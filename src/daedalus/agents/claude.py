"""Claude Code: `claude -p --output-format stream-json --verbose` with turn and budget caps, prompt on stdin.

Daedalus writes `~/.claude/settings.json` in the attempt's own home (the model, permissions bypassed: the
bubblewrap sandbox confines it) and passes `--setting-sources user` and `--strict-mcp-config`, so settings,
hooks and MCP servers a repository carries are not loaded. Inside the sandbox Claude Code runs as its user
namespace's root, which it accepts only with IS_SANDBOX=1.

Events (Claude Code 2.1.328, recorded in tests/agents/fixtures/claude-*.jsonl): system{subtype:init, model,
session_id, tools, cwd}, assistant{message{id, model, content[text|tool_use], usage}}, user{message{content
[tool_result]}}, result{subtype, is_error, num_turns, total_cost_usd, usage, modelUsage, result, errors,
terminal_reason, api_error_status}. An assistant event's usage is the stream's start (its output tokens are
not final); the result's `modelUsage` has the whole run's tokens per model (its `usage` can miss the last
request), and `total_cost_usd` is Claude Code's own price for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from daedalus.agents.cli import CliAgent, EventParser
from daedalus.agents.costs import CostMeter
from daedalus.agents.tools import Toolbox
from daedalus.errors import AgentConfigError, BudgetExceeded
from daedalus.schemas.agents import AgentTask

WRITE_TOOLS = {"Write", "Edit", "MultiEdit", "NotebookEdit"}
ANTHROPIC_URL = "https://api.anthropic.com"


class ClaudeParser(EventParser):
    def __init__(self, task: AgentTask, meter: CostMeter, toolbox: Toolbox, home: Path):
        super().__init__(task, meter, toolbox, home)
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
        if usage and message.get("model") != "<synthetic>":  # Claude Code's own note of an API error
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
        if event.get("total_cost_usd") is not None and self.meter.priced:
            # Claude Code's own price for the tokens (list prices); not for a model it does not bill.
            self.meter.provider_cost = float(event["total_cost_usd"])
        if event.get("num_turns") is not None:
            self.meter.turns = int(event["num_turns"])
        totals = _model_usage(event.get("modelUsage")) or _usage(event.get("usage"))
        if totals is None or totals[0] < self.meter.input_tokens:
            totals = (self.meter.input_tokens, self.meter.output_tokens, self.meter.cached_input_tokens)
        over: BudgetExceeded | None = None
        try:
            self.meter.set_totals(
                input_tokens=totals[0], output_tokens=totals[1], cached_input_tokens=totals[2]
            )
        except BudgetExceeded as error:
            over = error  # said below, after what Claude Code itself said
        if isinstance(event.get("result"), str):
            self.final_text = event["result"]
        if subtype == "success" and not event.get("is_error"):
            self.claimed = None  # read the RESULT line of the final text
            if over is not None:
                raise over
            return
        self.claimed = False
        if "budget" in subtype:
            cost = event.get("total_cost_usd")
            raise BudgetExceeded(
                f"claude stopped at its budget cap ({subtype}, ${cost} by its own count)"
                + (f"; {over}" if over else "")
            )
        if over is not None:
            raise over
        errors = "; ".join(str(e) for e in event.get("errors") or [])
        if event.get("api_error_status") is not None:
            self.error = f"API error {event['api_error_status']}: {event.get('result') or errors}"
        elif subtype == "error_max_turns":
            self.error = f"error_max_turns: stopped at its turn limit after {event.get('num_turns')} turns"
        else:
            self.error = (
                f"{subtype or 'error'}"
                + (f": {errors}" if errors else "")
                + (f" after {event.get('num_turns')} turns" if event.get("num_turns") is not None else "")
            )


def _usage(usage: Any) -> tuple[int, int, int] | None:
    if not isinstance(usage, dict) or not usage:
        return None
    cached = int(usage.get("cache_read_input_tokens") or 0)
    total_in = (
        int(usage.get("input_tokens") or 0) + cached + int(usage.get("cache_creation_input_tokens") or 0)
    )
    return total_in, int(usage.get("output_tokens") or 0), cached


def _model_usage(per_model: Any) -> tuple[int, int, int] | None:
    if not isinstance(per_model, dict) or not per_model:
        return None
    inp = out = cached = 0
    for usage in per_model.values():
        if not isinstance(usage, dict):
            continue
        read = int(usage.get("cacheReadInputTokens") or 0)
        inp += int(usage.get("inputTokens") or 0) + read + int(usage.get("cacheCreationInputTokens") or 0)
        out += int(usage.get("outputTokens") or 0)
        cached += read
    return inp, out, cached


class ClaudeAgent(CliAgent):
    name = "claude"
    label = "claude (Claude Code, `claude -p --output-format stream-json`)"

    def configured_binary(self) -> str:
        return self.settings.claude_bin

    def model(self, task: AgentTask) -> str:
        return task.agent.model or self.settings.anthropic_model

    def endpoint(self) -> str:
        return self.settings.anthropic_base_url or ANTHROPIC_URL

    def priced(self) -> bool:
        if self.settings.anthropic_priced is not None:
            return self.settings.anthropic_priced
        return urlsplit(self.endpoint()).hostname == "api.anthropic.com"

    def args(self, task: AgentTask) -> list[str]:
        argv = [
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--max-turns",
            str(task.max_turns),
            "--model",
            self.model(task),
            "--permission-mode",
            "bypassPermissions",
            "--setting-sources",
            "user",
            "--strict-mcp-config",
            *self.settings.claude_args,
        ]
        if task.agent.budget_usd is not None and self.settings.claude_budget_flag:
            argv += ["--max-budget-usd", f"{task.agent.budget_usd:.2f}"]
        return argv

    def provider_env(self, base_url: str) -> dict[str, str]:
        if self.settings.anthropic_api_key is None:
            raise AgentConfigError(
                "no Anthropic API key for the claude agent on this worker: set DAEDALUS_AGENT_ANTHROPIC_API_KEY "
                "(or ANTHROPIC_API_KEY)"
            )
        return {
            "ANTHROPIC_API_KEY": self.settings.anthropic_api_key.get_secret_value(),
            "ANTHROPIC_BASE_URL": base_url,
            # The sandbox maps the worker's user to root in its own user namespace; Claude Code refuses to
            # bypass permissions as root unless told it is sandboxed, which it is.
            "IS_SANDBOX": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        }

    def configure(self, task: AgentTask, home: Path, base_url: str) -> None:
        settings = {
            "model": self.model(task),
            "permissions": {"defaultMode": "bypassPermissions"},
            "includeCoAuthoredBy": False,
        }
        (home / ".claude").mkdir(parents=True, exist_ok=True)
        (home / ".claude" / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")

    def parser(self, task: AgentTask, meter: CostMeter, toolbox: Toolbox, home: Path) -> EventParser:
        return ClaudeParser(task, meter, toolbox, home)
