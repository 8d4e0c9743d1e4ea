"""File and shell tools for tool-loop agents, run inside the worktree's bubblewrap sandbox.

Every tool call (the file tools too) is one sandboxed process that sees only the worktree read-write, the
toolchain read-only, no network and a clean environment (see `daedalus.sandbox`); when it ends, nothing it
started is left alive. The path checks and the deny list in front of it are not the confinement: they give a
sloppy model a clear refusal (counted towards ending the attempt) instead of a puzzling failure.
Output is read as a stream and capped: a huge file or a chatty command costs the worker a bounded buffer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from daedalus.confinement import Confinement
from daedalus.errors import ForbiddenCommand, PathEscape, ToolError
from daedalus.processes import end_step, step_token
from daedalus.sandbox import Sandbox
from daedalus.schemas.steps import ResourceLimits

MAX_READ = 60_000
MAX_OUTPUT = 8_000
CHUNK = 64 * 1024
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


@dataclass(frozen=True)
class Captured:
    """What a sandboxed call printed, bounded: `data` is its first or last `limit` bytes of `total`."""

    returncode: int | None
    data: bytes
    total: int
    timed_out: bool
    limits_hit: list[str] = field(default_factory=list)
    """The limits the call ran into (daedalus.confinement), from the kernel's counters."""

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)


async def _read_capped(
    stream: asyncio.StreamReader, limit: int, keep: Literal["head", "tail"]
) -> tuple[bytes, int]:
    """Read `stream` to its end keeping at most `limit` bytes (the first or the last); returns them and the
    total. With `head`, stops reading once the limit is reached (the caller ends the process)."""
    chunks: collections.deque[bytes] = collections.deque()
    kept = total = 0
    while chunk := await stream.read(CHUNK):
        total += len(chunk)
        chunks.append(chunk)
        kept += len(chunk)
        if keep == "head" and kept > limit:
            break
        while keep == "tail" and kept - len(chunks[0]) >= limit:
            kept -= len(chunks.popleft())
    data = b"".join(chunks)
    return (data[:limit], total) if keep == "head" else (data[-limit:] if limit else b"", total)


class Toolbox:
    """The tools of one attempt, rooted at its worktree, each call run in `sandbox` (by default: the worktree's,
    without network)."""

    def __init__(
        self,
        root: Path,
        *,
        deny: Sequence[str],
        shell_timeout_s: float = 600.0,
        sandbox: Sandbox | None = None,
        limits: ResourceLimits | None = None,
        cgroup_root: Path | None = None,
    ):
        self.root = root.resolve()
        self.deny = [re.compile(pattern) for pattern in deny]
        self.shell_timeout_s = shell_timeout_s
        self.sandbox = sandbox or Sandbox.for_worktree(self.root)
        self.limits = limits
        """Each call's limits (processes and memory in a cgroup of its own, its file size); None: none."""
        self.cgroup_root = cgroup_root

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
                    # Normalised first: `/usr/../tmp/x` is /tmp/x, not a system tool.
                    if os.path.normpath(token).startswith(READ_ONLY_PREFIXES):
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
            return await self.read_file(str(arguments.get("path", "")))
        if name == "write_file":
            return await self.write_file(str(arguments.get("path", "")), str(arguments.get("content", "")))
        if name == "list_dir":
            return await self.list_dir(str(arguments.get("path", ".")))
        if name == "run_shell":
            return await self.run_shell(str(arguments.get("command", "")))
        raise ToolError(f"unknown tool {name!r}; tools: {[s['name'] for s in TOOL_SPECS]}")

    async def sandboxed(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        limit: int,
        keep: Literal["head", "tail"],
        timeout_s: float,
    ) -> Captured:
        """Run `argv` in the sandbox, stdout and stderr together read with a cap. Whatever the call started is
        dead when this returns, however it ends (exit, cap, timeout, cancellation)."""
        token = step_token()
        confinement = Confinement.start(self.limits, self.cgroup_root) if self.limits is not None else None
        try:
            process = await asyncio.create_subprocess_exec(
                *self.sandbox.argv(argv),
                env=self.sandbox.environment(token),
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=confinement.preexec if confinement is not None else None,
            )
        except BaseException:
            if confinement is not None:
                confinement.end()
            raise
        assert process.stdout is not None
        try:
            if stdin is not None:
                assert process.stdin is not None
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    process.stdin.write(stdin)
                    await process.stdin.drain()
                process.stdin.close()
            try:
                async with asyncio.timeout(timeout_s):
                    data, total = await _read_capped(process.stdout, limit, keep)
                    if keep == "tail" or total <= limit:
                        await process.wait()
                timed_out = False
            except TimeoutError:
                data, total, timed_out = b"", 0, True
        finally:
            await asyncio.to_thread(end_step, process.pid, token)
            await process.wait()
            hits = (await asyncio.to_thread(confinement.end))[0] if confinement is not None else []
        return Captured(None if timed_out else process.returncode, data, total, timed_out, hits)

    async def read_file(self, path: str) -> str:
        full = self.resolve(path)
        if not full.is_file():
            raise ToolError(f"{path!r} is not a file")
        read = await self.sandboxed(
            ["cat", "--", str(full)], limit=MAX_READ, keep="head", timeout_s=self.shell_timeout_s
        )
        if read.returncode not in (0, None) and not read.truncated:
            raise ToolError(f"cannot read {path!r}: {read.data.decode(errors='replace').strip()}")
        text = read.data.decode(errors="replace")
        if read.truncated:
            text += f"\n[... truncated: the file is longer than {MAX_READ} bytes ...]"
        return text

    async def write_file(self, path: str, content: str) -> str:
        full = self.resolve(path)
        if full.is_symlink():
            raise PathEscape(f"{path!r} is a symlink; write its target inside the repository instead")
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        wrote = await self.sandboxed(
            ["/bin/sh", "-c", script, "write_file", str(full)],
            stdin=content.encode(),
            limit=MAX_OUTPUT,
            keep="tail",
            timeout_s=self.shell_timeout_s,
        )
        if wrote.returncode != 0:
            raise ToolError(f"cannot write {path!r}: {wrote.data.decode(errors='replace').strip()}")
        return f"wrote {len(content)} characters to {full.relative_to(self.root)}"

    async def list_dir(self, path: str) -> str:
        full = self.resolve(path)
        if not full.is_dir():
            raise ToolError(f"{path!r} is not a directory")
        listed = await self.sandboxed(
            ["ls", "-A1p", "--", str(full)], limit=MAX_READ, keep="head", timeout_s=self.shell_timeout_s
        )
        if listed.returncode not in (0, None) and not listed.truncated:
            raise ToolError(f"cannot list {path!r}: {listed.data.decode(errors='replace').strip()}")
        names = [n for n in listed.data.decode(errors="replace").splitlines() if n.rstrip("/") != ".git"]
        return "\n".join(names) or "(empty)"

    async def run_shell(self, command: str) -> str:
        if not command.strip():
            raise ToolError("`command` must not be empty")
        self.check_command(command)
        ran = await self.sandboxed(
            ["/bin/sh", "-c", command], limit=MAX_OUTPUT, keep="tail", timeout_s=self.shell_timeout_s
        )
        if ran.timed_out:
            return f"command timed out after {self.shell_timeout_s:.0f}s and was killed"
        text = ran.data.decode(errors="replace")
        if ran.truncated:
            text = f"[... output truncated: last {MAX_OUTPUT} of {ran.total} bytes ...]\n" + text
        hit = "".join(f"\nthe command {line}" for line in ran.limits_hit)
        return f"exit code {ran.returncode}{hit}\n{text}"
