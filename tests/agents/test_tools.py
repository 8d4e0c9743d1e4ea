"""Tools confined to the worktree: path escapes (symlinks too), .git, the deny list, shell timeouts."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from daedalus.agents.settings import DEFAULT_DENY
from daedalus.agents.tools import Toolbox
from daedalus.errors import ForbiddenCommand, PathEscape, ToolError


@pytest.fixture
def box(tmp_path: Path) -> Toolbox:
    root = tmp_path / "wt"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("x = 1\n")
    (root / ".git").mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", root / "link")
    os.symlink(tmp_path, root / "dirlink")
    return Toolbox(root, deny=DEFAULT_DENY)


@pytest.mark.parametrize(
    "path", ["../secret.txt", "/etc/passwd", "link", "dirlink/secret.txt", "~/x", ".git/config"]
)
def test_paths_outside_the_worktree_are_refused(box: Toolbox, path: str) -> None:
    with pytest.raises(PathEscape, match=r"outside the worktree|inside \.git"):
        box.resolve(path)


async def test_writes_through_a_symlink_do_not_escape(box: Toolbox, tmp_path: Path) -> None:
    with pytest.raises(PathEscape):
        await box.call("write_file", {"path": "dirlink/evil.txt", "content": "x"})
    with pytest.raises(PathEscape):
        await box.call("write_file", '{"path": "link", "content": "x"}')
    assert (tmp_path / "secret.txt").read_text() == "secret"
    assert not (tmp_path / "evil.txt").exists()


async def test_file_tools_work_inside(box: Toolbox) -> None:
    assert await box.call("read_file", {"path": "src/a.py"}) == "x = 1\n"
    await box.call("write_file", {"path": "src/new/b.py", "content": "y = 2\n"})
    assert "b.py" in await box.call("list_dir", {"path": "src/new"})
    listing = await box.call("list_dir", {"path": "."})
    assert ".git" not in listing and "src/" in listing
    with pytest.raises(ToolError, match="unknown tool"):
        await box.call("delete_everything", {})
    with pytest.raises(ToolError, match="not valid JSON"):
        await box.call("read_file", "{nope")


@pytest.mark.parametrize(
    "command",
    [
        "sudo ls",
        "curl http://example.com",
        "git push origin HEAD",
        "cat /etc/passwd",
        "cd .. && ls",
        "rm -rf ~",
        "wget x",
        "ls --directory=/home",
        "cat ../secret.txt",
        "pkill python",
    ],
)
def test_forbidden_commands(box: Toolbox, command: str) -> None:
    with pytest.raises(ForbiddenCommand):
        box.check_command(command)


@pytest.mark.parametrize(
    "command", ["ls src", "python3 -c 'print(1)'", "/usr/bin/env true", "git commit -m x"]
)
def test_ordinary_commands_pass(box: Toolbox, command: str) -> None:
    box.check_command(command)


async def test_shell_runs_in_the_worktree_and_timeouts_kill_the_group(box: Toolbox) -> None:
    out = await box.call("run_shell", {"command": "pwd && echo hi"})
    assert out.startswith("exit code 0") and str(box.root) in out and "hi" in out
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    # A timeout of its own: the box's default leaves a loaded machine's sandbox start plenty of room.
    short = Toolbox(box.root, deny=DEFAULT_DENY, shell_timeout_s=3.0)
    out = await short.call("run_shell", {"command": "sleep 30 & sleep 30; echo never"})
    assert "timed out" in out
    after = {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    assert after <= before
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] == ["sleep", "30"] and p.ppid() in (1, os.getpid())
    ]
