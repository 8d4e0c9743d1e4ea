"""The bubblewrap sandbox every agent command runs in: one worktree writable, nothing else of the host.

What a sandboxed command sees (decided here, documented in the README):

* the attempt's worktree, read-write, at its own path (so paths in transcripts mean the same outside);
* the toolchain, read-only: `/usr` (with `/bin`, `/lib*`, `/sbin` as on the host) and from `/etc` only what
  programs need to start (dynamic linker cache, alternatives, locale, time zone, TLS roots); no name
  resolution. No `/etc/passwd`, `/etc/shadow`, `/etc/hostname`, no `/root`, `/home`, `/work`,
  `/opt`, `/var`, `/srv`, `/mnt`: they are absent;
* its own `/tmp`, `/var/tmp` and `$HOME` (empty tmpfs, gone when the command ends, unless a home directory
  is given, as for the CLI agents), `/dev` (minimal), and a `/proc` of its own pid namespace, so neither the
  worker's processes nor their environments are visible;
* its own git directory (`<worktree>/.git`, inside the worktree, so the agent may commit, branch and
  configure there as it likes) and, read-only, the host repository's object store it borrows from. The
  host's repository itself (config, hooks, refs, HEAD) is never mounted: the host commits the attempt's
  files there itself (`daedalus.agents.worktree.capture`);
* no network (a loopback of its own). The CLI agents, which call their model endpoint themselves, do not get
  it either: their one way out is `daedalus.egress` (a forwarder on their loopback, a
  Unix socket bound in read-only, and a gateway on the host that admits their endpoint and nothing else);
* a clean environment: PATH, HOME, locale, a git identity, the step's marker token and what its caller adds
  (the CLI agents: their own provider's key). Never the worker's environment;
* for a build or a gate (`for_step`), also: Daedalus's own installation and the engine cache, read-only
  (the cache layered over a scratch directory of the step, so what the step adds to it dies with the step),
  the host's read-only data paths, a scratch directory for its output, and the leased GPUs' device nodes
  only. Never the store, the artifact directory of other steps, Temporal or the API (no network).

All capabilities are dropped, every namespace is unshared (user, pid, ipc, uts, cgroup, net), the command runs in a new session (no TIOCSTI on the worker's terminal) and dies with its parent.
The pid namespace means that when the command's first process exits, the kernel kills every process it left
behind, `setsid` and `nohup` ones included. Resource limits are daedalus.confinement's.
"""

from __future__ import annotations

import os
import shutil
import site
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from daedalus.errors import SandboxError, SandboxUnavailable
from daedalus.processes import STEP_TOKEN_ENV

SANDBOX_ENV = "DAEDALUS_SANDBOX"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOME = "/home/agent"
# /etc entries a toolchain needs to start: the linker cache, Debian's alternatives, locale and time zone, and the
# public TLS roots (a CLI agent checks its provider's certificate through the egress gateway's CONNECT tunnel).
ETC_TOOLCHAIN = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "locale.alias",
    "locale.conf",
    "mime.types",
    "ssl",
    "ca-certificates",
)
TOP_LEVEL_ALIASES = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
AGENT_IDENTITY = {
    "GIT_AUTHOR_NAME": "daedalus-agent",
    "GIT_AUTHOR_EMAIL": "agent@daedalus.local",
    "GIT_COMMITTER_NAME": "daedalus-agent",
    "GIT_COMMITTER_EMAIL": "agent@daedalus.local",
}


def bwrap_binary() -> str:
    """The host's `bwrap`, else the one an offline bundle put beside this Python (daedalus.hosts.bundle_install),
    or SandboxUnavailable saying how to install it."""
    bundled = Path(sys.executable).parent / "bwrap"
    found = shutil.which("bwrap") or (str(bundled) if os.access(bundled, os.X_OK) else None)
    if found is None:
        raise SandboxUnavailable(
            "bubblewrap (`bwrap`) is not installed on this host, and agents only run inside it: install it "
            "with `make system` (Debian/Ubuntu: `apt-get install bubblewrap`), then restart the worker"
        )
    return found


@dataclass(frozen=True)
class Sandbox:
    """How to run commands for one worktree. `argv` wraps a command; `environment` is all it may see."""

    worktree: Path
    objects: Path | None = None
    """The host repository's object store that the worktree's own git borrows (read-only)."""
    home: Path | None = None
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    layered: tuple[tuple[Path, Path], ...] = ()
    """(shared, scratch): `shared` appears with its entries read-only over the writable `scratch`."""
    devices: tuple[Path, ...] = ()
    """Device nodes the command may use (a leased GPU's), bound as they are on the host."""
    tmp_mib: int | None = None
    path: tuple[str, ...] = ()
    """Directories ahead of the toolchain's on PATH (Daedalus's own `bin`, for a build's or gate's commands)."""
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def for_worktree(
        cls,
        worktree: Path,
        *,
        objects: Path | None = None,
        home: Path | None = None,
        read_only: Sequence[Path | str] = (),
        writable: Sequence[Path | str] = (),
        env: Mapping[str, str] | None = None,
        tmp_mib: int | None = None,
    ) -> Sandbox:
        """A sandbox for an agent's commands in `worktree` (a private checkout borrowing `objects`)."""
        worktree = worktree.resolve()
        if not worktree.is_dir():
            raise SandboxError(f"worktree {worktree} does not exist")
        for path in (*read_only, *writable):
            if not Path(path).is_absolute():
                raise SandboxError(f"sandbox path {path!r} must be absolute")
        return cls(
            worktree=worktree,
            objects=objects.resolve() if objects is not None else None,
            home=home.resolve() if home is not None else None,
            read_only=tuple(Path(p) for p in read_only),
            writable=tuple(Path(p) for p in writable),
            env=dict(env or {}),
            tmp_mib=tmp_mib,
        )

    @classmethod
    def for_step(
        cls,
        worktree: Path,
        *,
        objects: Path | None,
        scratch: Path,
        cache: Path,
        read_only: Sequence[Path] = (),
        devices: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
        tmp_mib: int | None = None,
    ) -> Sandbox:
        """A sandbox for a build or a gate: the worktree and `scratch` writable, Daedalus and the engine cache
        read-only (the cache layered over `scratch/cache`), `DAEDALUS_HOME` in the scratch directory, no
        network, and `devices` (the leased GPUs) only."""
        install = installation()
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / "cache").mkdir(exist_ok=True)
        for path in read_only:
            if not path.is_absolute():
                raise SandboxError(f"sandbox path {str(path)!r} must be absolute")
        base = cls.for_worktree(worktree, objects=objects, tmp_mib=tmp_mib)
        return cls(
            worktree=base.worktree,
            objects=base.objects,
            read_only=(*install, *read_only),
            writable=(scratch.resolve(),),
            layered=((cache.resolve(), (scratch / "cache").resolve()),),
            devices=tuple(devices),
            tmp_mib=tmp_mib,
            path=(str(Path(sys.executable).parent),),
            env={
                "DAEDALUS_HOME": str(scratch.resolve() / "home"),
                "DAEDALUS_CACHE_DIR": str(cache.resolve()),
                # Python never puts the worktree on sys.path by itself (`python -m daedalus...` in a gate
                # must run Daedalus's code, not a `daedalus/` package the agent left in the worktree).
                "PYTHONSAFEPATH": "1",
                "PYTHONNOUSERSITE": "1",
                **(env or {}),
            },
        )

    def environment(self, token: str) -> dict[str, str]:
        """The whole environment of a sandboxed command: nothing is inherited from the worker."""
        return {
            "PATH": ":".join((*self.path, PATH)),
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
        for name in ETC_TOOLCHAIN:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        size = ["--size", str(self.tmp_mib * 1024 * 1024)] if self.tmp_mib else []
        args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/tmp", *size, "--tmpfs", "/var/tmp"]
        for device in self.devices:
            args += ["--dev-bind-try", str(device), str(device)]
        if self.home is not None:
            self.home.mkdir(parents=True, exist_ok=True)
            args += ["--bind", str(self.home), HOME]
        else:
            args += ["--tmpfs", HOME]
        for path in self.read_only:
            args += ["--ro-bind-try", str(path), str(path)]
        for shared, scratch in self.layered:
            args += _layered(shared, scratch)
        if self.objects is not None:
            args += ["--ro-bind", str(self.objects), str(self.objects)]
        args += ["--bind", str(self.worktree), str(self.worktree)]
        for path in self.writable:
            args += ["--bind-try", str(path), str(path)]
        args += ["--chdir", str(cwd or self.worktree), "--", *command]
        return args


def _layered(shared: Path, scratch: Path) -> list[str]:
    """`shared` as the command sees it: the writable `scratch` at its path, with every entry of `shared` two
    levels deep bound read-only over it (`models/x.gguf`, `llama.cpp/<build>`). What the command adds lands in
    `scratch`; nothing of `shared` can be changed."""
    args = ["--bind", str(scratch), str(shared)]
    if not shared.is_dir():
        return args
    for top in sorted(shared.iterdir()):
        if top.is_dir() and not top.is_symlink():
            args += ["--dir", str(top)]
            args += [
                arg
                for entry in sorted(top.iterdir())
                for arg in ("--ro-bind", str(entry), str(entry))
                if not entry.name.startswith(".")
            ]
        elif not top.name.startswith("."):
            args += ["--ro-bind", str(top), str(top)]
    return args


def installation() -> tuple[Path, ...]:
    """What running Daedalus itself needs (a gate's `daedalus engine measure`): its interpreter, its
    environment and, for an editable install, its source tree. Read-only in a step's sandbox."""
    package = Path(__file__).resolve().parent
    found = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), package.parent}
    # Site directories outside both prefixes: a GPU image's own venv (/opt/torch/.venv), which an offline
    # bundle's venv reads its numpy, scipy and torch from through a .pth file.
    user = site.getusersitepackages()
    found |= {
        Path(p).resolve() for p in sys.path if p.endswith("site-packages") and p != user and Path(p).is_dir()
    }
    return tuple(sorted(found))
