"""Codex and Claude Code adapters against fake executables that emit the documented JSONL events."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from daedalus.agents.base import EVENTS_FILE, RUNNING_FILE, USAGE_FILE
from daedalus.agents.claude import ClaudeAgent
from daedalus.agents.codex import CodexAgent
from daedalus.agents.costs import load_usage
from daedalus.agents.settings import AgentSettings
from daedalus.errors import AgentConfigError
from daedalus.schemas.agents import ExitReason
from tests.agents.conftest import Beats, MakeTask
from tests.agents.fakes import fake_cli_settings, sleeping, unique_sleep, write_fake_cli

CODEX_OK = """
emit(type="thread.started", thread_id="th_1")
emit(type="turn.started")
emit(type="item.started", item={"id": "i1", "type": "command_execution", "command": "bash -lc 'ls'",
     "status": "in_progress"})
emit(type="item.completed", item={"id": "i1", "type": "command_execution", "command": "bash -lc 'ls'",
     "aggregated_output": "speed.txt", "exit_code": 0, "status": "completed"})
open("speed.txt", "w").write("56.0\\n")
emit(type="item.completed", item={"id": "i2", "type": "file_change", "status": "completed",
     "changes": [{"path": os.path.abspath("speed.txt"), "kind": "update"}]})
sh("git add -A && git commit -qm 'fix align tax'")
emit(type="item.completed", item={"id": "i3", "type": "agent_message", "text": "Fixed.\\nRESULT: success"})
emit(type="turn.completed", usage={"input_tokens": 12000, "cached_input_tokens": 2000, "output_tokens": 900})
"""


async def test_codex_runs_streams_and_reports_usage(
    tmp_path: Path, make_task: MakeTask, artifacts: Path, beats: Beats, monkeypatch: pytest.MonkeyPatch
) -> None:
    side = tmp_path / "side"
    side.mkdir()
    monkeypatch.setenv("FAKE_SIDE_DIR", str(side))
    fake = write_fake_cli(tmp_path / "codex", CODEX_OK)
    task = make_task({"name": "codex", "model": "gpt-5-codex", "budget_usd": 5})
    result = await CodexAgent(fake_cli_settings(tmp_path, codex_bin=str(fake))).run(
        task, artifacts=artifacts, heartbeat=beats
    )
    assert result.exit_reason is ExitReason.COMMITTED, result.detail
    assert result.claimed_success is True
    argv = json.loads((side / "argv.json").read_text())
    assert argv[:2] == ["exec", "--json"] and argv[-1] == "-" and argv[argv.index("-C") + 1] == task.worktree
    prompt = (side / "prompt.txt").read_text()
    for piece in (
        "Make decode reach 55",
        "no new dependencies",
        "sm70 has no fp8",
        "28.9 tok/s",
        task.branch,
    ):
        assert piece in prompt
    usage = result.usage
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (12000, 2000, 900)
    # 10k uncached * 1.25 + 2k cached * 0.125 + 900 out * 10, per million
    assert usage.cost_source == "estimated" and usage.cost_usd == pytest.approx(0.02175)
    assert Path(result.transcript or "").name == EVENTS_FILE
    assert len((artifacts / EVENTS_FILE).read_text().splitlines()) == 7
    assert not (artifacts / RUNNING_FILE).exists()


async def test_codex_unknown_model_cost_is_unavailable_not_zero(
    tmp_path: Path, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    fake = write_fake_cli(tmp_path / "codex", CODEX_OK)
    task = make_task({"name": "codex", "budget_usd": 1})
    result = await CodexAgent(fake_cli_settings(tmp_path, codex_bin=str(fake))).run(
        task, artifacts=artifacts, heartbeat=beats
    )
    assert result.usage.cost_usd is None and result.usage.cost_source == "unavailable"
    assert result.usage.input_tokens == 12000
    assert "not enforceable" in result.detail
    assert "cost unavailable" in result.summary()


async def test_codex_that_hangs_is_killed_with_its_children(
    tmp_path: Path, make_task: MakeTask, artifacts: Path, beats: Beats, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = write_fake_cli(
        tmp_path / "codex",
        """
emit(type="thread.started", thread_id="th_1")
child = subprocess.Popen(["sleep", os.environ["FAKE_SLEEP"]], start_new_session=True)
open(os.path.join(os.environ["FAKE_PIDS"], "child"), "w").write(str(child.pid))
time.sleep(300)
""",
    )
    pids = tmp_path / "pids"
    pids.mkdir()
    task = make_task({"name": "codex"}, idle_timeout_s=1)
    agent = CodexAgent(fake_cli_settings(tmp_path, codex_bin=str(fake)))
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    monkeypatch.setenv("FAKE_SLEEP", sleep := unique_sleep())
    started = time.monotonic()
    result = await agent.run(task, artifacts=artifacts, heartbeat=beats)
    assert result.exit_reason is ExitReason.TIMEOUT and "no event" in result.detail
    assert time.monotonic() - started < 15
    assert (pids / "child").exists(), "the fake started its child"
    assert not sleeping(sleep), "the agent's child (in a session of its own) outlived the agent"
    assert beats.details, "the supervisor heartbeats while it waits"


async def test_codex_crash_is_recorded_with_stderr(
    tmp_path: Path, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    fake = write_fake_cli(
        tmp_path / "codex",
        """
emit(type="thread.started", thread_id="th_1")
sys.stderr.write("panicked at 'sandbox denied'\\n")
sys.exit(3)
""",
    )
    task = make_task({"name": "codex"})
    result = await CodexAgent(fake_cli_settings(tmp_path, codex_bin=str(fake))).run(
        task, artifacts=artifacts, heartbeat=beats
    )
    assert result.exit_reason is ExitReason.FAILED
    assert "exited 3" in result.detail and "sandbox denied" in result.detail


async def test_codex_forbidden_command_and_outside_write_stop_the_agent(
    tmp_path: Path, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    for item in (
        {"type": "command_execution", "command": "git push origin HEAD", "status": "in_progress"},
        {"type": "file_change", "status": "completed", "changes": [{"path": "/etc/hosts", "kind": "update"}]},
    ):
        fake = write_fake_cli(
            tmp_path / "codex",
            f"""
emit(type="item.started", item={item!r})
time.sleep(60)
""",
        )
        out = artifacts / item["type"]
        out.mkdir()
        task = make_task({"name": "codex"})
        result = await CodexAgent(fake_cli_settings(tmp_path, codex_bin=str(fake))).run(
            task, artifacts=out, heartbeat=beats
        )
        assert result.exit_reason is ExitReason.FORBIDDEN, result.detail
        assert "forbidden" in result.detail or "outside its worktree" in result.detail


async def test_missing_codex_binary_says_which_setting(
    make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:

    with pytest.raises(AgentConfigError, match="DAEDALUS_AGENT_CODEX_BIN"):
        await CodexAgent(AgentSettings(codex_bin="/nonexistent/codex")).run(
            make_task({"name": "codex"}), artifacts=artifacts, heartbeat=beats
        )


CLAUDE_OK = """
emit(type="system", subtype="init", session_id="s1", model="claude-sonnet-4-5", tools=["Bash", "Edit"])
msg = {"id": "msg_1", "model": "claude-sonnet-4-5", "role": "assistant",
       "usage": {"input_tokens": 3000, "output_tokens": 400, "cache_read_input_tokens": 1000,
                 "cache_creation_input_tokens": 0}}
emit(type="assistant", message={**msg, "content": [{"type": "tool_use", "id": "tu1", "name": "Edit",
     "input": {"file_path": os.path.abspath("speed.txt"), "old_string": "28.9", "new_string": "56.0"}}]})
emit(type="assistant", message={**msg, "content": [{"type": "tool_use", "id": "tu2", "name": "Bash",
     "input": {"command": "git commit -am fix"}}]})
open("speed.txt", "w").write("56.0\\n")
sh("git commit -qam fix")
emit(type="user", message={"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu2",
     "content": "ok"}]})
emit(type="result", subtype="success", is_error=False, duration_ms=1200, num_turns=3,
     result="Done.\\nRESULT: success", session_id="s1", total_cost_usd=0.0213,
     usage={"input_tokens": 3100, "output_tokens": 450, "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 0})
"""


async def test_claude_reports_provider_cost_and_passes_caps(
    tmp_path: Path, make_task: MakeTask, artifacts: Path, beats: Beats, monkeypatch: pytest.MonkeyPatch
) -> None:
    side = tmp_path / "side"
    side.mkdir()
    monkeypatch.setenv("FAKE_SIDE_DIR", str(side))
    fake = write_fake_cli(tmp_path / "claude", CLAUDE_OK)
    task = make_task({"name": "claude", "budget_usd": 2.5}, max_turns=7)
    result = await ClaudeAgent(fake_cli_settings(tmp_path, claude_bin=str(fake))).run(
        task, artifacts=artifacts, heartbeat=beats
    )
    assert result.exit_reason is ExitReason.COMMITTED and result.claimed_success is True
    argv = json.loads((side / "argv.json").read_text())
    assert argv[:5] == ["-p", "--output-format", "stream-json", "--verbose", "--max-turns"]
    assert argv[5] == "7" and argv[argv.index("--max-budget-usd") + 1] == "2.50"
    assert result.usage.cost_source == "provider" and result.usage.cost_usd == pytest.approx(0.0213)
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.turns) == (4100, 450, 3)


async def test_claude_over_budget_is_killed_and_usage_kept(
    tmp_path: Path, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    fake = write_fake_cli(
        tmp_path / "claude",
        """
emit(type="system", subtype="init", session_id="s1", model="claude-opus-4-1")
for i in range(5):
    emit(type="assistant", message={"id": f"m{i}", "model": "claude-opus-4-1", "content": [],
         "usage": {"input_tokens": 20000, "output_tokens": 2000}})
    time.sleep(0.05)
time.sleep(60)
""",
    )
    task = make_task({"name": "claude", "budget_usd": 0.5})
    started = time.monotonic()
    result = await ClaudeAgent(fake_cli_settings(tmp_path, claude_bin=str(fake))).run(
        task, artifacts=artifacts, heartbeat=beats
    )
    assert result.exit_reason is ExitReason.BUDGET_EXCEEDED and "over its budget" in result.detail
    assert time.monotonic() - started < 20
    assert result.usage.cost_source == "estimated" and result.usage.cost_usd is not None
    assert result.usage.cost_usd > 0.5 and result.usage.input_tokens >= 20000
    kept = load_usage(artifacts / USAGE_FILE)
    assert kept is not None and kept.input_tokens == result.usage.input_tokens


async def test_claude_max_turns_is_a_failure(
    tmp_path: Path, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    fake = write_fake_cli(
        tmp_path / "claude",
        """
emit(type="result", subtype="error_max_turns", is_error=True, num_turns=7, total_cost_usd=0.4,
     usage={"input_tokens": 10, "output_tokens": 5})
""",
    )
    result = await ClaudeAgent(fake_cli_settings(tmp_path, claude_bin=str(fake))).run(
        make_task({"name": "claude"}), artifacts=artifacts, heartbeat=beats
    )
    assert result.exit_reason is ExitReason.FAILED and "error_max_turns" in result.detail
    assert result.claimed_success is False and result.usage.cost_usd == pytest.approx(0.4)
