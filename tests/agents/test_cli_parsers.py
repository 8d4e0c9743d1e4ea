"""The codex and claude parsers on what the real programs printed (tests/agents/fixtures/, recorded by
`python -m tests.agents.fixtures.record`): usage, cost, final message, failures, and the checks that stop an
agent doing what it must not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from daedalus.agents.claude import ClaudeParser
from daedalus.agents.codex import CodexParser
from daedalus.agents.costs import CostMeter
from daedalus.agents.settings import DEFAULT_DENY
from daedalus.agents.tools import Toolbox
from daedalus.errors import AgentViolation, BudgetExceeded
from tests.agents.conftest import MakeTask

FIXTURES = Path(__file__).parent / "fixtures"


def lines(name: str, worktree: str) -> list[bytes]:
    text = (FIXTURES / f"{name}.jsonl").read_text().replace("{worktree}", worktree)
    return [line.encode() for line in text.splitlines()]


def codex(make_task: MakeTask, tmp_path: Path, budget: float | None = None) -> tuple[CodexParser, str]:
    task = make_task({"name": "codex", "budget_usd": budget} if budget else {"name": "codex"})
    meter = CostMeter(model="gpt-5-codex", budget_usd=budget, path=None)
    home = tmp_path / "home"
    return CodexParser(task, meter, Toolbox(Path(task.worktree), deny=DEFAULT_DENY), home), task.worktree


def claude(make_task: MakeTask, tmp_path: Path, budget: float | None = None) -> tuple[ClaudeParser, str]:
    task = make_task({"name": "claude"})
    meter = CostMeter(model="claude-sonnet-4-5", budget_usd=budget, path=None)
    return ClaudeParser(task, meter, Toolbox(Path(task.worktree), deny=DEFAULT_DENY), tmp_path), task.worktree


def test_codex_change_run(make_task: MakeTask, tmp_path: Path) -> None:
    parser, worktree = codex(make_task, tmp_path)
    for line in lines("codex-change", worktree):
        parser.feed_line(line)
    done = json.loads(lines("codex-change", worktree)[-1])
    assert done["type"] == "turn.completed"
    usage = parser.meter.usage()
    assert (usage.input_tokens, usage.output_tokens) == (
        done["usage"]["input_tokens"],
        done["usage"]["output_tokens"],
    )
    assert usage.cost_source == "estimated" and usage.cost_usd is not None and usage.cost_usd > 0
    assert parser.final_text is not None and parser.final_text.endswith("RESULT: success")
    executions = [x for x in lines("codex-change", worktree) if b'"type":"command_execution"' in x]
    assert parser.commands == len(executions) == 4  # two commands, each started and completed
    assert parser.warnings and "Model metadata" in parser.warnings[0], (
        "Codex's warning items are not failures"
    )
    assert parser.finish() is None


def test_codex_rollout_gives_the_running_usage_and_enforces_the_budget_mid_turn(
    make_task: MakeTask, tmp_path: Path
) -> None:
    counts = [json.loads(line) for line in (FIXTURES / "codex-change.rollout.jsonl").read_text().splitlines()]
    totals = [c["payload"]["info"]["total_token_usage"]["input_tokens"] for c in counts]
    assert totals == sorted(totals) and len(totals) == 4
    sessions = tmp_path / "home" / ".codex" / "sessions" / "2026" / "12" / "03"
    sessions.mkdir(parents=True)
    rollout = sessions / "rollout-x.jsonl"
    parser, _ = codex(make_task, tmp_path)
    parser.poll()
    assert parser.meter.input_tokens == 0, "no rollout yet"
    rollout.write_text((FIXTURES / "codex-change.rollout.jsonl").read_text().splitlines()[0] + "\n")
    parser._next_glob = 0
    parser.poll()
    assert parser.meter.input_tokens == totals[0] and parser.meter.turns == 1
    # The same file, a budget that the second response crosses: stopped before the turn ends.
    tight = totals[0] * 1.25 / 1e6 * 1.5
    parser, _ = codex(make_task, tmp_path, budget=tight)
    shutil.copyfile(FIXTURES / "codex-change.rollout.jsonl", rollout)
    with pytest.raises(BudgetExceeded, match="over its budget"):
        parser.poll()
    assert parser.meter.input_tokens == totals[1]


def test_codex_failure(make_task: MakeTask, tmp_path: Path) -> None:
    parser, worktree = codex(make_task, tmp_path)
    for line in lines("codex-error", worktree):
        parser.feed_line(line)
    error = parser.finish()
    assert error is not None and "scripted error 400" in error
    assert parser.meter.usage().cost_source == "unavailable", "no usage reported is not $0.00"


def test_codex_items_that_break_the_rules(make_task: MakeTask, tmp_path: Path) -> None:
    parser, worktree = codex(make_task, tmp_path)
    change = next(json.loads(x) for x in lines("codex-change", worktree) if b'"type":"file_change"' in x)
    change["item"]["changes"][0]["path"] = "/etc/hosts"
    with pytest.raises(AgentViolation, match="outside its worktree"):
        parser.feed(change)
    command = next(
        json.loads(x) for x in lines("codex-change", worktree) if b'"type":"command_execution"' in x
    )
    command["item"]["command"] = "/bin/bash -lc 'git push origin HEAD'"
    with pytest.raises(AgentViolation, match="forbidden command"):
        parser.feed(command)


def test_claude_change_run_takes_the_whole_runs_usage_and_its_own_cost(
    make_task: MakeTask, tmp_path: Path
) -> None:
    parser, worktree = claude(make_task, tmp_path)
    for line in lines("claude-change", worktree):
        parser.feed_line(line)
    result = json.loads(lines("claude-change", worktree)[-1])
    usage = parser.meter.usage()
    [per_model] = result["modelUsage"].values()
    assert (usage.input_tokens, usage.output_tokens) == (per_model["inputTokens"], per_model["outputTokens"])
    assert usage.cost_source == "provider" and usage.cost_usd == result["total_cost_usd"]
    assert usage.turns == result["num_turns"]
    assert parser.claimed is None and parser.final_text == result["result"]
    assert parser.finish() is None


def test_claude_budget_cap_is_a_budget_stop_with_the_last_requests_usage(
    make_task: MakeTask, tmp_path: Path
) -> None:
    parser, worktree = claude(make_task, tmp_path)
    events = lines("claude-budget", worktree)
    result = json.loads(events[-1])
    assert result["subtype"] == "error_max_budget_usd"
    # Its `usage` misses the request that crossed the cap; `modelUsage` has it.
    [per_model] = result["modelUsage"].values()
    assert per_model["inputTokens"] > result["usage"]["input_tokens"]
    with pytest.raises(BudgetExceeded, match="budget cap"):
        for line in events:
            parser.feed_line(line)
    assert parser.meter.input_tokens == per_model["inputTokens"]


@pytest.mark.parametrize(
    ("fixture", "error"),
    [
        ("claude-max-turns", "turn limit after 3 turns"),
        ("claude-api-error", "API error 400: API Error: 400 scripted"),
    ],
)
def test_claude_failures_say_why(make_task: MakeTask, tmp_path: Path, fixture: str, error: str) -> None:
    parser, worktree = claude(make_task, tmp_path)
    for line in lines(fixture, worktree):
        parser.feed_line(line)
    assert parser.claimed is False
    assert error in (parser.finish() or "")


def test_claude_tool_uses_that_break_the_rules(make_task: MakeTask, tmp_path: Path) -> None:
    parser, worktree = claude(make_task, tmp_path)
    edit = next(json.loads(x) for x in lines("claude-change", worktree) if b'"name":"Edit"' in x)
    edit["message"]["content"][0]["input"]["file_path"] = "/home/agent/.bashrc"
    with pytest.raises(AgentViolation, match="outside its worktree"):
        parser.feed(edit)
    bash = next(json.loads(x) for x in lines("claude-change", worktree) if b'"name":"Bash"' in x)
    bash["message"]["content"][0]["input"]["command"] = "sudo rm -rf /"
    with pytest.raises(AgentViolation, match="forbidden command"):
        parser.feed(bash)


def test_claudes_own_cost_counts_only_for_a_priced_endpoint(make_task: MakeTask, tmp_path: Path) -> None:
    task = make_task({"name": "claude"})
    meter = CostMeter(model="claude-sonnet-4-5", budget_usd=None, path=None, priced=False)
    parser = ClaudeParser(task, meter, Toolbox(Path(task.worktree), deny=DEFAULT_DENY), tmp_path)
    for line in lines("claude-change", task.worktree):
        parser.feed_line(line)
    usage = meter.usage()
    assert usage.input_tokens > 0 and usage.cost_usd is None and usage.cost_source == "unavailable"
