"""The bubblewrap sandbox every agent command runs in: one worktree writable, nothing else of the host.

What a sandboxed command sees (decided here, documented in the README):

* the attempt's worktree, read-write, at its own path (so paths in transcripts mean the same outside);
* the toolchain, read-only: `/usr` (with `/bin`, `/lib*`, `/sbin` as on the host) and from `/etc` only what
  programs need to start (dynamic linker cache, alternatives, locale, time zone, TLS roots; with network,
  also name resolution). No `/etc/passwd`, `/etc/shadow`, `/etc/hostname`, no `/root`, `/home`, `/work`,
  `/opt`, `/var`, `/srv`, `/mnt`: they are absent;
* its own `/tmp`, `/var/tmp` and `$HOME` (empty tmpfs, gone when the command ends, unless a home directory
  is given, as for the CLI agents), `/dev` (minimal), and a `/proc` of its own pid namespace, so neither the
  worker's processes nor their environments are visible;
* the engine repository's git directory read-only, except what a commit in this worktree writes: the object
  store, this worktree's admin directory (HEAD, index, its reflog) and the refs and reflogs of its ticket's
  branches. The repository's `config`, `hooks`, `packed-refs`, other branches, and the files that tell git
  where the repository is (`<worktree>/.git`, `commondir`, `gitdir`) stay read-only, so nothing an agent
  does there can make a later `git` on the host run its code;
* no network (a loopback of its own) unless asked for: only the CLI agents, which call their model endpoint
  themselves, get the host's network (bubblewrap cannot limit it to one endpoint);
* a clean environment: PATH, HOME, locale, a git identity, the step's marker token and what its caller adds
  (the CLI agents: their own provider's key). Never the worker's environment.

All capabilities are dropped, every namespace is unshared (user, pid, ipc, uts, cgroup, and net unless
allowed), the command runs in a new session (no TIOCSTI on the worker's terminal) and dies with its parent.
The pid namespace means that when the command's first process exits, the kernel kills every process it left
behind, `setsid` and `nohup` ones included.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from daedalus.errors import SandboxError, SandboxUnavailable
from daedalus.processes import STEP_TOKEN_ENV

SANDBOX_ENV = "DAEDALUS_SANDBOX"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOME = "/home/agent"
# /etc entries a toolchain needs to start: the linker cache, Debian's alternatives, locale and time zone.
ETC_TOOLCHAIN = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "locale.alias",
    "locale.conf",
    "mime.types",
)
# With network: resolving names and checking certificates.
ETC_NETWORK = ("resolv.conf", "hosts", "nsswitch.conf", "host.conf", "gai.conf", "ssl", "ca-certificates")
TOP_LEVEL_ALIASES = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
AGENT_IDENTITY = {
    "GIT_AUTHOR_NAME": "daedalus-agent",
    "GIT_AUTHOR_EMAIL": "agent@daedalus.local",
    "GIT_COMMITTER_NAME": "daedalus-agent",
    "GIT_COMMITTER_EMAIL": "agent@daedalus.local",
}


def bwrap_binary() -> str:
    """The `bwrap` executable, or SandboxUnavailable saying how to install it."""
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailable(
            "bubblewrap (`bwrap`) is not installed on this host, and agents only run inside it: install it "
            "with `make system` (Debian/Ubuntu: `apt-get install bubblewrap`), then restart the worker"
        )
    return found


@dataclass(frozen=True)
class GitLayout:
    """Where a linked worktree's git data lives, read from its files (never by running git in it)."""

    dot_git: Path  # <worktree>/.git: a file for a linked worktree, a directory for a plain clone
    common: Path | None  # the repository's git directory (objects, refs, config, hooks)
    admin: Path | None  # <common>/worktrees/<name>: this worktree's HEAD, index and reflog

    @classmethod
    def of(cls, worktree: Path) -> GitLayout:
        dot_git = worktree / ".git"
        if not dot_git.is_file():
            return cls(dot_git, None, None)
        text = dot_git.read_text().strip()
        if not text.startswith("gitdir:"):
            raise SandboxError(f"{dot_git} is not a git worktree link (no 'gitdir:' line)")
        admin = Path(text.removeprefix("gitdir:").strip())
        admin = (admin if admin.is_absolute() else worktree / admin).resolve()
        commondir = admin / "commondir"
        if not commondir.is_file():
            raise SandboxError(f"{admin} has no commondir file: is {worktree} a `git worktree add` checkout?")
        common = Path(commondir.read_text().strip())
        common = (common if common.is_absolute() else admin / common).resolve()
        if admin.parent != common / "worktrees":
            raise SandboxError(f"{worktree}'s git admin directory {admin} is not under {common}/worktrees")
        return cls(dot_git, common, admin)


@dataclass(frozen=True)
class Sandbox:
    """How to run commands for one worktree. `argv` wraps a command; `environment` is all it may see."""

    worktree: Path
    branch: str | None = None
    network: bool = False
    home: Path | None = None
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def for_worktree(
        cls,
        worktree: Path,
        *,
        branch: str | None = None,
        network: bool = False,
        home: Path | None = None,
        read_only: Sequence[Path | str] = (),
        writable: Sequence[Path | str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Sandbox:
        """A sandbox for `worktree`. Without `branch`, the one checked out now (read before any agent ran, so
        an agent that later points HEAD elsewhere cannot widen what it may write)."""
        worktree = worktree.resolve()
        if not worktree.is_dir():
            raise SandboxError(f"worktree {worktree} does not exist")
        layout = GitLayout.of(worktree)
        if branch is None and layout.admin is not None:
            head = (layout.admin / "HEAD").read_text().strip()
            if head.startswith("ref: refs/heads/"):
                branch = head.removeprefix("ref: refs/heads/")
        for path in (*read_only, *writable):
            if not Path(path).is_absolute():
                raise SandboxError(f"sandbox path {path!r} must be absolute")
        return cls(
            worktree=worktree,
            branch=branch,
            network=network,
            home=home.resolve() if home is not None else None,
            read_only=tuple(Path(p) for p in read_only),
            writable=tuple(Path(p) for p in writable),
            env=dict(env or {}),
        )

    def environment(self, token: str) -> dict[str, str]:
        """The whole environment of a sandboxed command: nothing is inherited from the worker."""
        return {
            "PATH": PATH,
            "HOME": HOME,
            "USER": "agent",
            "LOGNAME": "agent",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": "/tmp",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_NOSYSTEM": "1",
            **AGENT_IDENTITY,
            **self.env,
            SANDBOX_ENV: "bwrap",
            STEP_TOKEN_ENV: token,
        }

    def argv(self, command: Sequence[str], *, cwd: Path | None = None) -> list[str]:
        """`bwrap ... -- command`, to be started with `environment(token)` as its whole environment."""
        args = [
            bwrap_binary(),
            "--unshare-all",
            *(["--share-net"] if self.network else []),
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for name in TOP_LEVEL_ALIASES:
            top = Path("/") / name
            if top.is_symlink():
                args += ["--symlink", os.readlink(top), str(top)]
            elif top.is_dir():
                args += ["--ro-bind", str(top), str(top)]
        for name in ETC_TOOLCHAIN + (ETC_NETWORK if self.network else ()):
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
        if self.home is not None:
            self.home.mkdir(parents=True, exist_ok=True)
            args += ["--bind", str(self.home), HOME]
        else:
            args += ["--tmpfs", HOME]
        for path in self.read_only:
            args += ["--ro-bind-try", str(path), str(path)]
        args += self._git_mounts()
        args += ["--bind", str(self.worktree), str(self.worktree)]
        if GitLayout.of(self.worktree).dot_git.exists():
            # Inside the worktree, yet read-only: a rewritten `.git` file could point host git at a config
            # the agent wrote (core.fsmonitor runs a command on the next `git status`).
            dot_git = str(self.worktree / ".git")
            args += ["--ro-bind", dot_git, dot_git]
        for path in self.writable:
            args += ["--bind-try", str(path), str(path)]
        args += ["--chdir", str(cwd or self.worktree), "--", *command]
        return args

    def _git_mounts(self) -> list[str]:
        layout = GitLayout.of(self.worktree)
        if layout.common is None or layout.admin is None:
            return []  # a plain clone: its .git is bound read-only with the worktree (see argv)
        common, admin = layout.common, layout.admin
        args = [
            "--ro-bind",
            str(common),
            str(common),
            "--bind",
            str(common / "objects"),
            str(common / "objects"),
        ]
        if self.branch:
            # A commit writes `<ref>.lock` next to the ref and renames it: the ref's directory must be
            # writable. Only the directory of this ticket's branches, never refs/heads itself.
            # A branch at the top of refs/heads gets none: refs/heads would be all branches.
            branch_dir = Path(self.branch).parent
            for tree in ("refs/heads", "logs/refs/heads") if branch_dir != Path(".") else ():
                directory = common / tree / branch_dir
                if not directory.resolve().is_relative_to(common / tree):
                    raise SandboxError(f"branch {self.branch!r} points outside {common / tree}")
                directory.mkdir(parents=True, exist_ok=True)
                args += ["--bind", str(directory), str(directory)]
        args += ["--bind", str(admin), str(admin)]
        for pointer in ("commondir", "gitdir"):
            if (admin / pointer).exists():
                args += ["--ro-bind", str(admin / pointer), str(admin / pointer)]
        return args
