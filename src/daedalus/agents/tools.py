"""File and shell tools for tool-loop agents, confined to one worktree.

Paths are resolved (symlinks included) and must stay inside the worktree and out of `.git`; shell commands
run in the worktree, in their own process group, and are refused when they match the deny list or name a path
outside the worktree. This is a guard against mistakes and sloppy models, not a sandbox against an adversary.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from daedalus.errors import ForbiddenCommand, PathEscape, ToolError
from daedalus.processes import kill_group

MAX_READ = 60_000
MAX_OUTPUT = 8_000
# Absolute paths a command may name without escaping the worktree: system tools, never user data.
READ_ONLY_PREFIXES = ("/usr/", "/bin/", "/lib", "/opt/", "/dev/null", "/etc/alternatives/")


TOOL_SPECS: list[dict[str, Any]] = [
    {
        "name": "read_file",
        "description": "Read a text file of the repository. Paths are relative to the repository root.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a text file of the repository with `content`.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "list_dir",
        "description": "List a directory of the repository ('.' for the root).",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "run_shell",
        "description": "Run a shell command in the repository root (tests, builds, git add/commit). "
        "Network, sudo, git push and paths outside the repository are refused.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
]


def openai_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": spec} for spec in TOOL_SPECS]


def anthropic_tools() -> list[dict[str, Any]]:
    return [
        {"name": s["name"], "description": s["description"], "input_schema": s["parameters"]}
        for s in TOOL_SPECS
    ]


class Toolbox:
    """The tools of one attempt, rooted at its worktree."""

    def __init__(self, root: Path, *, deny: Sequence[str], shell_timeout_s: float = 600.0):
        self.root = root.resolve()
        self.deny = [re.compile(pattern) for pattern in deny]
        self.shell_timeout_s = shell_timeout_s

    def resolve(self, path: str) -> Path:
        """The real path of `path` inside the worktree, or PathEscape saying why not."""
        if not isinstance(path, str) or not path.strip():
            raise ToolError("`path` must be a non-empty string relative to the repository root")
        candidate = Path(path).expanduser()
        full = (candidate if candidate.is_absolute() else self.root / candidate).resolve()
        if full != self.root and not full.is_relative_to(self.root):
            raise PathEscape(
                f"path {path!r} resolves to {full}, outside the worktree {self.root}; "
                "use a path inside the repository (symlinks are followed)"
            )
        if full.relative_to(self.root).parts[:1] == (".git",):
            raise PathEscape(f"path {path!r} is inside .git; change files through git commands instead")
        return full

    def check_command(self, command: str) -> None:
        for pattern in self.deny:
            if pattern.search(command):
                raise ForbiddenCommand(
                    f"command {command!r} is forbidden (matches deny rule {pattern.pattern!r}); "
                    "stay inside the repository and do not use the network"
                )
        try:
            words = shlex.split(command, comments=True)
        except ValueError as error:
            raise ToolError(f"cannot parse command {command!r}: {error}") from error
        for word in words:
            for token in re.split(r"[=:]", word) if word.startswith("-") else [word]:
                if token.startswith(("/", "~")) or "../" in token or token == "..":
                    if token.startswith(READ_ONLY_PREFIXES):
                        continue
                    try:
                        self.resolve(token)
                    except PathEscape as error:
                        raise ForbiddenCommand(
                            f"command {command!r} names a path outside the worktree: {error}"
                        ) from None

    async def call(self, name: str, arguments: str | dict[str, Any]) -> str:
        """Run one tool call; raises ToolError with a message meant for the model."""
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as error:
                raise ToolError(f"arguments of {name} are not valid JSON: {error}") from error
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments of {name} must be a JSON object")
        if name == "read_file":
            return self.read_file(str(arguments.get("path", "")))
        if name == "write_file":
            return self.write_file(str(arguments.get("path", "")), str(arguments.get("content", "")))
        if name == "list_dir":
            return self.list_dir(str(arguments.get("path", ".")))
        if name == "run_shell":
            return await self.run_shell(str(arguments.get("command", "")))
        raise ToolError(f"unknown tool {name!r}; tools: {[s['name'] for s in TOOL_SPECS]}")

    def read_file(self, path: str) -> str:
        full = self.resolve(path)
        if not full.is_file():
            raise ToolError(f"{path!r} is not a file")
        data = full.read_bytes()[:MAX_READ]
        return data.decode(errors="replace")

    def write_file(self, path: str, content: str) -> str:
        full = self.resolve(path)
        full.parent.mkdir(parents=True, exist_ok=True)
        if full.is_symlink():
            raise PathEscape(f"{path!r} is a symlink; write its target inside the repository instead")
        full.write_text(content)
        return f"wrote {len(content)} characters to {full.relative_to(self.root)}"

    def list_dir(self, path: str) -> str:
        full = self.resolve(path)
        if not full.is_dir():
            raise ToolError(f"{path!r} is not a directory")
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in full.iterdir() if p.name != ".git")
        return "\n".join(names) or "(empty)"

    async def run_shell(self, command: str) -> str:
        if not command.strip():
            raise ToolError("`command` must not be empty")
        self.check_command(command)
        env = {
            **os.environ,
            "GIT_TERMINAL_PROMPT": "0",
            # Commits made through the shell tool need an identity, and must not borrow the host user's.
            "GIT_AUTHOR_NAME": "daedalus-agent",
            "GIT_AUTHOR_EMAIL": "agent@daedalus.local",
            "GIT_COMMITTER_NAME": "daedalus-agent",
            "GIT_COMMITTER_EMAIL": "agent@daedalus.local",
        }
        process = await asyncio.create_subprocess_shell(
            command,
            cwd=self.root,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(process.communicate(), timeout=self.shell_timeout_s)
        except TimeoutError:
            await asyncio.to_thread(kill_group, process.pid)
            await process.wait()
            return f"command timed out after {self.shell_timeout_s:.0f}s and was killed"
        except BaseException:
            await asyncio.to_thread(kill_group, process.pid)
            raise
        text = out.decode(errors="replace")
        if len(text) > MAX_OUTPUT:
            text = "[... output truncated ...]\n" + text[-MAX_OUTPUT:]
        return f"exit code {process.returncode}\n{text}"
