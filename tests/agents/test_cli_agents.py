"""The real Codex CLI and Claude Code as Daedalus's `codex` and `claude` agents: in their sandbox, with their
egress to the local model server only, answering its script (tool calls that make a change, then a message)."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from daedalus.agents.base import EVENTS_FILE, RUNNING_FILE, USAGE_FILE
from daedalus.agents.claude import ClaudeAgent
from daedalus.agents.cli import CONFINEMENT_FILE, EGRESS_FILE, CliAgent
from daedalus.agents.codex import CodexAgent
from daedalus.agents.costs import load_usage, price_for
from daedalus.agents.model_server import ModelScript, ModelServer, Reply, Shell, Step, WriteFile
from daedalus.agents.settings import AgentSettings
from daedalus.devserver import DevServer
from daedalus.errors import AgentConfigError
from daedalus.schemas.agents import ExitReason
from daedalus.schemas.steps import ResourceLimits
from tests.agents.clis import cli_settings, egress_decisions, hang, hanging, new_key, the_change
from tests.agents.conftest import Beats, MakeTask
from tests.agents.fakes import unique_sleep

AGENTS: dict[str, type[CliAgent]] = {"codex": CodexAgent, "claude": ClaudeAgent}


def agent_for(name: str, server: ModelServer, key: str, **fields: object) -> CliAgent:
    return AGENTS[name](cli_settings(server, key, **fields))


def describe(pid: int) -> str:
    try:
        process = psutil.Process(pid)
        return f"{process.status()} {process.cmdline()[:3]}"
    except psutil.NoSuchProcess:
        return "gone"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("name", ["codex", "claude"])
async def test_the_cli_makes_the_scripted_change_and_its_usage_is_the_attempts_cost(
    name: str, model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    key = new_key()
    script = model_server.add(key, the_change(name))
    task = make_task({"name": name, "budget_usd": 5})
    result = await agent_for(name, model_server, key).run(task, artifacts=artifacts, heartbeat=beats)
    assert result.exit_reason is ExitReason.COMMITTED, result.detail
    assert result.claimed_success is True
    assert (Path(task.worktree) / "speed.txt").read_text() == "56.0\n"
    # The program ran the commands and sent their output back to the model.
    assert script.requests == len(script.steps)
    assert "28.9" in script.tool_results[0] and "56.0" in script.tool_results[-1]
    assert script.first_request is not None and "Make decode reach 55 tok/s." in json.dumps(
        script.first_request
    )
    # What the model reported is what the attempt's cost record holds.
    sent = script.totals()
    usage = result.usage
    assert (usage.input_tokens, usage.output_tokens) == (sent.input_tokens, sent.output_tokens)
    price = price_for(usage.model)
    assert price is not None and usage.cost_usd is not None
    listed = (sent.input_tokens * price.input + sent.output_tokens * price.output) / 1e6
    assert usage.cost_usd == pytest.approx(listed, abs=1e-6)
    assert usage.cost_source == ("estimated" if name == "codex" else "provider")
    kept = load_usage(artifacts / USAGE_FILE)
    assert kept is not None and kept.input_tokens == sent.input_tokens
    # Its own JSONL went to the transcript, and its way out was the model endpoint only.
    events = [json.loads(line) for line in (artifacts / EVENTS_FILE).read_text().splitlines()]
    assert events and events[-1]["type"] == ("turn.completed" if name == "codex" else "result")
    allowed = {d["target"] for d in egress_decisions(artifacts) if d["allowed"]}
    assert allowed == {f"127.0.0.1:{model_server.port}"}
    assert not Path(json.loads((artifacts / EGRESS_FILE).read_text())["directory"]).exists()
    assert not (artifacts / RUNNING_FILE).exists()
    assert beats.details, "the supervisor heartbeats while the agent works"


async def test_codex_writes_its_config_and_runs_the_model_daedalus_chose(
    model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    key = new_key()
    script = model_server.add(
        key, ModelScript.of(WriteFile("notes.txt", "kv cache\n"), Reply("RESULT: success"))
    )
    task = make_task({"name": "codex", "model": "gpt-5-mini"})
    result = await agent_for("codex", model_server, key).run(task, artifacts=artifacts, heartbeat=beats)
    assert result.exit_reason is ExitReason.COMMITTED, result.detail
    assert (Path(task.worktree) / "notes.txt").read_text() == "kv cache\n"
    config = (artifacts / "home" / ".codex" / "config.toml").read_text()
    assert 'approval_policy = "never"' in config and 'sandbox_mode = "danger-full-access"' in config
    assert script.first_request is not None and script.first_request["model"] == "gpt-5-mini"
    assert result.usage.model == "gpt-5-mini"
    # Codex asked for more than its model (analytics): the gateway refused it, and said so.
    refused = [d for d in egress_decisions(artifacts) if not d["allowed"]]
    assert all(d["route"] == "proxy" for d in refused)


@pytest.mark.parametrize("name", ["codex", "claude"])
async def test_a_cli_over_its_budget_is_stopped_mid_run_and_its_usage_kept(
    name: str, model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    # Each answer reports 400k input tokens: $0.50 at gpt-5-codex's list price, $1.20 at claude-sonnet-4-5's.
    key = new_key()
    steps = [Step(Shell(f"echo step {i}"), input_tokens=400_000, output_tokens=100) for i in range(12)]
    script = model_server.add(key, ModelScript.of(*steps, Reply("RESULT: success")))
    task = make_task({"name": name, "budget_usd": 1.0})
    started = time.monotonic()
    result = await agent_for(name, model_server, key).run(task, artifacts=artifacts, heartbeat=beats)
    assert result.exit_reason is ExitReason.BUDGET_EXCEEDED, result.detail
    assert "budget" in result.detail
    assert script.requests < len(script.steps), "stopped before its script ran out"
    assert time.monotonic() - started < 30
    assert result.usage.cost_usd is not None and result.usage.cost_usd > 1.0
    assert result.usage.input_tokens >= 400_000
    kept = load_usage(artifacts / USAGE_FILE)
    assert kept is not None and kept.input_tokens == result.usage.input_tokens
    assert not (artifacts / RUNNING_FILE).exists()


async def test_claudes_own_budget_cap_stops_it_when_output_is_what_costs(
    model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    # 100k output tokens an answer ($1.50 at claude-sonnet-4-5's list price): Claude Code's stream shows an
    # answer's output tokens only in its result, so its own cap (--max-budget-usd) is what stops it.
    key = new_key()
    steps = [Step(Shell(f"echo {i}"), input_tokens=1000, output_tokens=100_000) for i in range(4)]
    script = model_server.add(key, ModelScript.of(*steps, Reply("RESULT: success")))
    result = await agent_for("claude", model_server, key).run(
        make_task({"name": "claude", "budget_usd": 1.0}), artifacts=artifacts, heartbeat=beats
    )
    assert result.exit_reason is ExitReason.BUDGET_EXCEEDED, result.detail
    assert "by its own count" in result.detail and script.requests == 1
    assert result.usage.cost_source == "provider" and (result.usage.cost_usd or 0) > 1.0


@pytest.mark.parametrize("name", ["codex", "claude"])
async def test_a_cli_that_hangs_in_a_tool_is_killed_with_the_tools_processes(
    name: str, model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    key = new_key()
    marker = unique_sleep()
    model_server.add(key, ModelScript.of(Shell(hang(marker)), Reply("RESULT: success")))
    task = make_task({"name": name}, idle_timeout_s=3)
    started = time.monotonic()
    result = await agent_for(name, model_server, key).run(task, artifacts=artifacts, heartbeat=beats)
    assert result.exit_reason is ExitReason.TIMEOUT and "no event" in result.detail, result.detail
    assert time.monotonic() - started < 30
    assert not hanging(marker), "the command the CLI ran outlived it"


@pytest.mark.parametrize("name", ["codex", "claude"])
async def test_cancelling_a_cli_mid_tool_ends_its_whole_tree_and_its_egress(
    name: str, model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    key = new_key()
    marker = unique_sleep()
    model_server.add(key, ModelScript.of(Shell(hang(marker)), Reply("RESULT: success")))
    task = make_task({"name": name})
    run = asyncio.create_task(
        agent_for(name, model_server, key).run(task, artifacts=artifacts, heartbeat=beats)
    )
    deadline = time.monotonic() + 30
    while not hanging(marker):
        assert time.monotonic() < deadline, "the CLI never ran its tool"
        assert not run.done(), run.result()
        await asyncio.sleep(0.05)
    pid = json.loads((artifacts / RUNNING_FILE).read_text())["pid"]
    tree = [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # Every process of the tree got its SIGKILL before the cancel returned; a big one (Claude Code maps 370 MB)
    # can take a moment to finish dying on a loaded host, so wait a bounded while for the last of them.
    deadline = time.monotonic() + 10
    while hanging(marker) or not all(gone(p) for p in tree):
        assert time.monotonic() < deadline, [(p, describe(p)) for p in tree if not gone(p)]
        await asyncio.sleep(0.05)
    assert not Path(json.loads((artifacts / EGRESS_FILE).read_text())["directory"]).exists()


@pytest.mark.parametrize("name", ["codex", "claude"])
async def test_a_cli_that_exits_non_zero_is_a_failed_attempt_saying_why(
    name: str, model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    key = new_key()
    model_server.add(key, ModelScript.of(Step(Reply(""), status=400)))
    result = await agent_for(name, model_server, key).run(
        make_task({"name": name}), artifacts=artifacts, heartbeat=beats
    )
    assert result.exit_reason is ExitReason.FAILED, result.detail
    assert "scripted error 400" in result.detail
    assert result.claimed_success is not True


async def test_claude_writing_outside_its_worktree_is_forbidden_and_nothing_lands(
    tmp_path: Path, model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    outside = tmp_path / "outside.txt"
    key = new_key()
    model_server.add(key, ModelScript.of(WriteFile(str(outside), "pwned\n"), Reply("RESULT: success")))
    result = await agent_for("claude", model_server, key).run(
        make_task({"name": "claude"}), artifacts=artifacts, heartbeat=beats
    )
    assert result.exit_reason is ExitReason.FORBIDDEN and "outside its worktree" in result.detail
    assert not outside.exists()


async def test_codex_commands_stay_in_the_worktree_and_a_forbidden_one_stops_it(
    tmp_path: Path, model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    outside = tmp_path / "outside.txt"
    repo_head = tmp_path / "engine" / ".git" / "HEAD"
    before = repo_head.read_text()
    key = new_key()
    script = model_server.add(
        key,
        ModelScript.of(
            # Paths outside the worktree exist in the sandbox only as its own empty scratch: what is written
            # there is gone with it, and the host's files are not there to read.
            Shell(
                f"echo pwned > {outside}; echo 'ref: refs/heads/x' > {repo_head}; cat /etc/passwd ~/.bashrc"
            ),
            Shell("git push origin HEAD"),
            Reply("RESULT: success"),
        ),
    )
    result = await agent_for("codex", model_server, key).run(
        make_task({"name": "codex"}), artifacts=artifacts, heartbeat=beats
    )
    assert result.exit_reason is ExitReason.FORBIDDEN and "git push" in result.detail, result.detail
    assert not outside.exists() and repo_head.read_text() == before
    assert "No such file or directory" in script.tool_results[0]


async def test_a_real_cli_reaches_its_model_and_nothing_else_on_the_host(
    model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats, temporal_server: DevServer
) -> None:
    """Codex's own shell tries Temporal's frontend, another HTTP server on the host's loopback (as the API
    would be) and the outside world; the model server is the one thing it reaches."""
    temporal_port = int(temporal_server.address.rpartition(":")[2])
    with ModelServer() as other:
        key = new_key()
        probe = (
            f"for port in {temporal_port} {other.port}; do (echo > /dev/tcp/127.0.0.1/$port) 2>&1 | tail -1; "
            'echo "port $port: $?"; done; (echo > /dev/tcp/1.1.1.1/443) 2>&1 | tail -1'
        )
        script = model_server.add(key, ModelScript.of(Shell(probe), Reply("RESULT: failure")))
        result = await agent_for("codex", model_server, key).run(
            make_task({"name": "codex"}), artifacts=artifacts, heartbeat=beats
        )
    assert result.exit_reason is ExitReason.COMMITTED, result.detail
    output = script.tool_results[0]
    assert output.count("Connection refused") == 2 and "Network is unreachable" in output, output
    assert not other.arrivals
    assert {d["target"] for d in egress_decisions(artifacts) if d["allowed"]} == {
        f"127.0.0.1:{model_server.port}"
    }


@pytest.mark.parametrize("name", ["codex", "claude"])
async def test_a_missing_cli_or_key_says_what_to_set(
    name: str,
    tmp_path: Path,
    model_server: ModelServer,
    make_task: MakeTask,
    artifacts: Path,
    beats: Beats,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task = make_task({"name": name})
    missing = AGENTS[name](AgentSettings(codex_bin="/nonexistent/codex", claude_bin="/nonexistent/claude"))
    with pytest.raises(AgentConfigError, match=f"DAEDALUS_AGENT_{name.upper()}_BIN"):
        await missing.run(task, artifacts=artifacts, heartbeat=beats)
    keyless = cli_settings(model_server, "k").model_copy(
        update={"openai_api_key": None, "anthropic_api_key": None}
    )
    scratch = tmp_path / "scratch"  # where the egress's sockets would go
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(AgentConfigError, match="API key"):
        await AGENTS[name](keyless).run(task, artifacts=artifacts, heartbeat=beats)
    assert not list(scratch.iterdir()), "a refused start leaves no egress behind"
    assert not (artifacts / RUNNING_FILE).exists()


@pytest.mark.parametrize("name", ["codex", "claude"])
async def test_a_cli_and_the_commands_it_runs_are_held_to_the_hosts_limits(
    name: str, model_server: ModelServer, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    key = new_key()
    script = model_server.add(
        key,
        ModelScript.of(
            # /tmp first: the forks after it take the whole cgroup's process budget, the CLI's own included
            Shell('python3 -c "import tempfile; tempfile.TemporaryFile().write(bytes(64 * 2**20))"'),
            Shell("for i in $(seq 400); do sleep 5 & done 2>/dev/null; wait; echo done"),
            Reply("RESULT: success"),
        ),
    )
    limits = ResourceLimits(processes=256, tmp_mib=16)
    task = make_task({"name": name}).model_copy(update={"limits": limits})
    result = await agent_for(name, model_server, key).run(task, artifacts=artifacts, heartbeat=beats)
    # The program and everything it started shared one cgroup: its forks past the limit were refused, its /tmp
    # filled at 16 MiB, and the attempt says which limit it met. The cgroup is gone with the agent.
    assert f"{name} hit its process limit (256 processes)" in result.detail, result.detail
    assert script.tool_results and "No space left on device" in script.tool_results[0], script.tool_results
    # ended: the record of its cgroup is removed only with the cgroup (daedalus.confinement.Confinement.end)
    assert not (artifacts / CONFINEMENT_FILE).exists(), "the agent's cgroup outlived it"
