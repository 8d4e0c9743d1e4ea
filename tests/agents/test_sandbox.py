"""Attacks on agent confinement, each run in a real bubblewrap sandbox against a real attempt checkout.

Every attack here ran on the host before the sandbox existed: the deny list and path checks were a filter,
and each of these slipped past it. The filter still stands in front of `run_shell` (a clear refusal for a
sloppy model), but it is not what these tests rely on: each attack runs in the sandbox exactly as `run_shell`
runs a command that got past the filter. The assertions look at the host, not at what the agent was told.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import sys
import threading
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from daedalus.agents import worktree as wt
from daedalus.agents.base import command_sandbox
from daedalus.agents.scripted import ScriptedAgent
from daedalus.agents.settings import DEFAULT_DENY, AgentSettings
from daedalus.agents.tools import MAX_OUTPUT, MAX_READ, Toolbox
from daedalus.config import Settings
from daedalus.errors import TreeRefused
from daedalus.sandbox import SandboxUnavailable, bwrap_binary
from daedalus.schemas.agents import AgentTask, ExitReason
from daedalus.schemas.steps import ResourceLimits
from tests.agents.conftest import Beats, MakeTask
from tests.agents.fakes import sleeping, unique_sleep
from tests.support import make_engine_repo

SECRETS = {
    "DAEDALUS_SLACK_BOT_TOKEN": "xoxb-slack-secret-4711",
    "DAEDALUS_API_TOKEN": "dtk_0000abcd_api-secret-4712",
    "OPENAI_API_KEY": "sk-openai-secret-4713",
    "ANTHROPIC_API_KEY": "sk-ant-secret-4714",
}


@pytest.fixture
def task(make_task: MakeTask) -> AgentTask:
    return make_task({"name": "openai"})


@pytest.fixture
def box(task: AgentTask) -> Toolbox:
    sandbox = command_sandbox(task, AgentSettings())
    return Toolbox(Path(task.worktree), deny=DEFAULT_DENY, shell_timeout_s=20, sandbox=sandbox)


def host_commit(task: AgentTask) -> str | None:
    """What the worker does when the agent is done: commit the worktree's files onto the attempt's branch."""
    captured = wt.capture(
        repo=Path(task.repo), worktree=Path(task.worktree), base=task.base_commit, branch=task.branch,
        message="attempt", allowed=["."],
    )  # fmt: skip
    return captured.commit


@pytest.fixture
def secret(tmp_path: Path) -> str:
    """A file outside the worktree that no agent may read."""
    text = f"outside-secret-{uuid.uuid4().hex}"
    (tmp_path / "secret.txt").write_text(text)
    return text


async def shell(box: Toolbox, command: str) -> str:
    """Run `command` as run_shell does once past its filter: in the sandbox, output capped."""
    ran = await box.sandboxed(["/bin/sh", "-c", command], limit=MAX_OUTPUT, keep="tail", timeout_s=20)
    return f"exit code {ran.returncode}\n" + ran.data.decode(errors="replace")


async def test_climbing_out_with_cd_finds_no_host_files(box: Toolbox, tmp_path: Path, secret: str) -> None:
    up = ";".join(["cd .."] * len(box.root.parts))
    out = await shell(
        box,
        f"{up};cat etc/hostname; cat {os.path.relpath(tmp_path / 'secret.txt', '/')}; pwd; echo probe-ran",
    )
    assert "probe-ran" in out and "\n/\n" in out, out  # the shell ran, and climbed to its own root
    assert Path("/etc/hostname").read_text().strip() not in out.split("\n", 1)[1]
    assert secret not in out


async def test_a_usr_prefix_does_not_open_the_host(box: Toolbox, tmp_path: Path, secret: str) -> None:
    target = Path("/tmp") / f"sandbox-escape-{uuid.uuid4().hex}"
    out = await shell(box, f"echo pwned > /usr/..{target}; cat /usr/..{tmp_path}/secret.txt; echo probe-ran")
    assert "probe-ran" in out and "No such file" in out, out  # it ran, and the host's files are not there
    assert not target.exists(), out
    assert secret not in out


async def test_home_is_empty_and_not_the_workers(
    box: Toolbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "worker-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE-KEY-4715")
    monkeypatch.setenv("HOME", str(home))
    out = await shell(box, "echo $HOME; ls -A $HOME; cat $HOME/.ssh/id_ed25519 ~/.ssh/id_ed25519; ls /root")
    assert out.splitlines()[1].startswith("/"), out  # it ran: the sandbox's own home was printed
    assert "PRIVATE-KEY-4715" not in out and str(home) not in out


async def test_python_cannot_open_host_files(box: Toolbox, tmp_path: Path, secret: str) -> None:
    program = (
        "import pathlib\n"
        f"for p in ['/etc/passwd', '/etc/shadow', '{tmp_path}/secret.txt', '/proc/1/environ']:\n"
        "    try: print(pathlib.Path(p).read_text())\n"
        "    except OSError as e: print('refused', p, e)\n"
    )
    out = await shell(box, f'python3 -c "{program}"')
    assert "root:" not in out and secret not in out
    assert out.count("refused") >= 3, out


async def test_git_config_cannot_plant_a_command_for_host_git(
    box: Toolbox, task: AgentTask, tmp_path: Path
) -> None:
    marker = tmp_path / "fsmonitor-ran"
    out = await shell(
        box,
        f"git config core.fsmonitor 'touch {marker}'; git config core.hooksPath /tmp;"
        f" printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/post-commit; chmod +x .git/hooks/post-commit;"
        " echo 56.0 > speed.txt",
    )
    # The worker commits the worktree afterwards: its git reads the host's repository, never the agent's.
    assert host_commit(task) is not None
    assert not marker.exists(), out
    got = subprocess.run(["git", "config", "--get", "core.fsmonitor"], cwd=task.repo, capture_output=True)
    assert got.stdout == b""


async def test_no_hook_can_be_written_into_the_main_repository(box: Toolbox, task: AgentTask) -> None:
    out = await shell(
        box,
        f'for d in {task.repo}/.git "$(git rev-parse --git-common-dir)"; do'
        ' printf "#!/bin/sh\\ntouch /tmp/hooked\\n" > "$d/hooks/post-commit"; done; echo tried',
    )
    assert "tried" in out
    assert not (Path(task.repo) / ".git" / "hooks" / "post-commit").exists(), out


async def test_the_host_repositorys_head_and_refs_are_out_of_reach(box: Toolbox, task: AgentTask) -> None:
    """The attack that moved `main` (the worktree's admin HEAD was writable): the agent points its HEAD at main and
    commits; the host's repository is not mounted, and the host commits the files onto the attempt's branch."""
    repo = Path(task.repo)
    main_before = wt.in_repo(repo, "rev-parse", "refs/heads/main")
    head_before = (repo / ".git" / "HEAD").read_text()
    out = await shell(
        box,
        "echo 'ref: refs/heads/main' > $(git rev-parse --git-dir)/HEAD; echo 56.0 > speed.txt;"
        " git add -A; git commit -qm evil; git update-ref refs/heads/main HEAD;"
        f" echo 'ref: refs/heads/evil' > {repo}/.git/HEAD; git -C {repo} update-ref refs/heads/main HEAD;"
        " git log --oneline -1",
    )
    assert "evil" in out, out  # the agent's own git did what it asked
    commit = host_commit(task)
    assert wt.in_repo(repo, "rev-parse", "refs/heads/main") == main_before, out
    assert (repo / ".git" / "HEAD").read_text() == head_before
    assert commit is not None and wt.in_repo(repo, "rev-parse", f"refs/heads/{task.branch}") == commit
    assert wt.changed_paths(repo, task.base_commit, commit) == ["speed.txt"]


async def test_the_shared_object_store_is_read_only(box: Toolbox, task: AgentTask) -> None:
    """The attack that replaced the stored blob of main:README (and could rewrite `objects/info/alternates`)."""
    repo = Path(task.repo)
    blob = wt.in_repo(repo, "rev-parse", "main:README")
    objects = wt.objects_dir(repo)
    stored = objects / blob[:2] / blob[2:]
    out = await shell(
        box,
        f"chmod u+w {stored}; printf 'agent was here' > {stored}; echo tried-blob;"
        f" echo /tmp > {objects}/info/alternates; echo tried-alternates;"
        f" echo x | git hash-object -w --stdin; touch {objects}/planted",
    )
    assert "tried-blob" in out and "tried-alternates" in out
    assert wt.in_repo(repo, "show", "main:README") == "toy engine"
    assert not (objects / "info" / "alternates").exists() and not (objects / "planted").exists(), out


async def test_a_nested_repository_or_a_huge_file_is_not_committed(box: Toolbox, task: AgentTask) -> None:
    out = await shell(
        box, "mkdir sub && cd sub && git init -q && git commit -q --allow-empty -m x && echo ok"
    )
    assert out.rstrip().endswith("ok"), out
    with pytest.raises(TreeRefused, match="nested git repository"):
        host_commit(task)
    assert wt.branch_head(Path(task.repo), task.branch) == task.base_commit


@pytest.fixture
def local_server() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"exfiltrated-4716")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", hits
    finally:
        server.shutdown()
        server.server_close()


async def test_no_network_from_a_tool_shell(box: Toolbox, local_server: tuple[str, list[str]]) -> None:
    url, hits = local_server
    out = await shell(
        box, f"python3 -c \"import urllib.request; print(urllib.request.urlopen('{url}').read())\""
    )
    assert hits == [] and "exfiltrated-4716" not in out
    assert "Connection refused" in out or "Network is unreachable" in out, out


async def test_env_holds_no_secret_of_the_worker(box: Toolbox, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    out = await shell(box, "env; cat /proc/*/environ | tr '\\0' '\\n'")
    for value in SECRETS.values():
        assert value not in out
    assert "DAEDALUS_SANDBOX=bwrap" in out and "DAEDALUS_STEP_TOKEN=" in out


async def test_setsid_and_nohup_children_die_with_the_tool_call(box: Toolbox) -> None:
    first, second = unique_sleep(), unique_sleep()
    command = f"setsid sleep {first} >/dev/null 2>&1 & nohup sleep {second} >/dev/null 2>&1 & echo started"
    out = await box.call("run_shell", {"command": command})
    assert "started" in out
    assert sleeping(first) == [] and sleeping(second) == []


async def test_scripted_commands_are_sandboxed_and_leave_nothing_running(
    make_task: MakeTask, artifacts: Path, beats: Beats, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    escaped = Path("/tmp") / f"scripted-escape-{uuid.uuid4().hex}"
    sleep = unique_sleep()
    task = make_task(
        {
            "name": "scripted",
            "commands": [
                f"setsid sleep {sleep} >/dev/null 2>&1 &",
                f"nohup sleep {sleep} >/dev/null 2>&1 &",
                "env > leaked.txt",
                f"touch {escaped} || true",
                "echo 56.0 > speed.txt",
            ],
        }
    )
    result = await ScriptedAgent(AgentSettings()).run(task, artifacts=artifacts, heartbeat=beats)
    assert result.exit_reason is ExitReason.COMMITTED, result.detail
    assert sleeping(sleep) == [], "a scripted command's setsid/nohup child outlived it"
    leaked = (Path(task.worktree) / "leaked.txt").read_text()
    assert all(value not in leaked for value in SECRETS.values())
    assert not escaped.exists()


async def test_a_normal_agent_edits_and_commits_through_the_sandbox(box: Toolbox, task: AgentTask) -> None:
    await box.call("write_file", {"path": "src/fast.py", "content": "SPEED = 56.0\n"})
    assert await box.call("read_file", {"path": "src/fast.py"}) == "SPEED = 56.0\n"
    assert "fast.py" in await box.call("list_dir", {"path": "src"})
    out = await shell(
        box,
        "echo 56.0 > speed.txt && git status --short && git add -A && git commit -qm 'speed up'"
        " && git log --oneline",
    )
    assert out.startswith("exit code 0") and "speed up" in out, out
    commit = host_commit(task)
    assert commit is not None
    assert wt.branch_head(Path(task.repo), task.branch) == commit
    assert wt.changed_paths(Path(task.repo), task.base_commit, commit) == ["speed.txt", "src/fast.py"]


async def test_reads_are_streamed_and_capped(box: Toolbox) -> None:
    big = box.root / "big.log"
    with big.open("wb") as handle:
        handle.write(b"x" * (30 * 1024 * 1024))
    tracemalloc.start()
    try:
        text = await box.call("read_file", {"path": "big.log"})
        out = await box.call("run_shell", {"command": "yes | head -c 30000000; echo; echo the-end"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text.startswith("x" * 100) and "truncated" in text and len(text) < MAX_READ + 200
    assert out.rstrip().endswith("the-end") and "truncated" in out and len(out) < MAX_OUTPUT + 200
    assert peak < 4 * 1024 * 1024, f"the worker held {peak} bytes to answer capped reads"


async def test_missing_bubblewrap_says_how_to_install_it(
    task: AgentTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable, match="make system"):
        bwrap_binary()
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        sandbox = command_sandbox(task, AgentSettings())
        await Toolbox(Path(task.worktree), deny=DEFAULT_DENY, sandbox=sandbox).call(
            "run_shell", {"command": "true"}
        )


def test_cli_agents_get_only_their_own_provider_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from daedalus.agents.claude import ClaudeAgent
    from daedalus.agents.codex import CodexAgent

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    repo = make_engine_repo(tmp_path / "engine")
    worktree = tmp_path / "wt"
    wt.prepare_worktree(repo=repo, base_commit="main", worktree=worktree, branch="daedalus/t1/attempt-1")
    task = AgentTask(
        ticket_id="t1",
        attempt=1,
        agent={"name": "codex"},
        brief="",
        repo=str(repo),
        base_commit="main",
        worktree=str(worktree),
        branch="daedalus/t1/attempt-1",
        spec="x",
    )
    settings = Settings.load(env_file=None).agent  # the test is the entry point that reads the environment
    codex = CodexAgent(settings).sandbox(task, tmp_path / "art", Path(sys.executable)).environment("t")
    claude = ClaudeAgent(settings).sandbox(task, tmp_path / "art", Path(sys.executable)).environment("t")
    assert codex["OPENAI_API_KEY"] == SECRETS["OPENAI_API_KEY"]
    assert claude["ANTHROPIC_API_KEY"] == SECRETS["ANTHROPIC_API_KEY"]
    for env, foreign in ((codex, "ANTHROPIC_API_KEY"), (claude, "OPENAI_API_KEY")):
        values = set(env.values())
        for name in ("DAEDALUS_SLACK_BOT_TOKEN", "DAEDALUS_API_TOKEN", foreign):
            assert SECRETS[name] not in values


def test_credentials_cannot_be_passed_into_sandboxes() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="look like credentials"):
        AgentSettings(sandbox_pass_env=["CUDA_HOME", "DAEDALUS_SLACK_BOT_TOKEN"])
    assert AgentSettings(sandbox_pass_env=["CUDA_HOME"]).sandbox_pass_env == ["CUDA_HOME"]


AGENT_LIMITS = ResourceLimits(processes=61, memory_mib=256, tmp_mib=16)
"""Small enough to hit here: the agent's commands run under the host's step limits, as builds and gates do. 61
processes is no other test's limit: a cgroup with it is this module's (other suites may run steps beside it)."""


@pytest.fixture
def limited_task(make_task: MakeTask) -> AgentTask:
    return make_task({"name": "openai"}).model_copy(update={"limits": AGENT_LIMITS})


@pytest.fixture
def limited_box(limited_task: AgentTask) -> Toolbox:
    sandbox = command_sandbox(limited_task, AgentSettings())
    return Toolbox(Path(limited_task.worktree), deny=DEFAULT_DENY, shell_timeout_s=30, sandbox=sandbox,
                   limits=limited_task.limits)  # fmt: skip


def agent_cgroups() -> list[Path]:
    """This module's step cgroups (by their process limit) that are still there."""
    found = []
    for path in Path("/sys/fs/cgroup/pids/daedalus").glob("step-*"):
        with contextlib.suppress(OSError):
            if (path / "pids.max").read_text().strip() == str(AGENT_LIMITS.processes):
                found.append(path)
    return found


async def test_an_agents_command_past_its_process_limit_is_told_so(limited_box: Toolbox) -> None:
    out = await limited_box.call(
        "run_shell", {"command": "for i in $(seq 200); do sleep 5 & done 2>/dev/null; echo forked; wait"}
    )
    # the kernel's counter of refused forks says the shell ran and met the limit
    assert "the command hit its process limit (61 processes)" in out, out
    assert agent_cgroups() == [], "the call's cgroup outlived it"


async def test_an_agents_command_past_its_memory_or_tmp_limit_is_told_so(limited_box: Toolbox) -> None:
    out = await limited_box.call(
        "run_shell", {"command": 'python3 -c "b = bytearray(600 * 2**20)"; echo after'}
    )
    assert "after" in out and "the command hit its memory limit (256 MiB)" in out, out
    out = await limited_box.call(
        "run_shell",
        {"command": 'python3 -c "import tempfile; tempfile.TemporaryFile().write(bytes(64 * 2**20))"'},
    )
    assert "No space left on device" in out, out  # its /tmp is a tmpfs of 16 MiB


async def test_scripted_commands_run_under_the_hosts_limits(
    make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    task = make_task(
        {"name": "scripted", "commands": ["for i in $(seq 200); do sleep 5 & done 2>/dev/null; wait; exit 3"]}
    ).model_copy(update={"limits": AGENT_LIMITS})
    result = await ScriptedAgent(AgentSettings()).run(task, artifacts=artifacts, heartbeat=beats)
    assert result.exit_reason is ExitReason.FAILED
    assert "hit its process limit (61 processes)" in result.detail, result.detail
