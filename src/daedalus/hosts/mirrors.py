"""Engine repositories by URL: each host keeps a `git clone --mirror` of every engine repo it works on, fetches
it before an attempt, and makes the attempt's worktree from it.

A repo that cannot be reached, or a base commit it does not have, is the host's environment failing, not the
agent: `EngineRepoUnavailable`, which the activities raise as a non-retryable ApplicationError of type
`ENVIRONMENT_ERROR` so that the ticket spends no attempt on it and escalates with what to fix.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from daedalus.errors import EngineRepoUnavailable

ENVIRONMENT_ERROR = "HostEnvironmentError"
"""The ApplicationError type of an environment failure on a host (engine repo unreachable, commit missing)."""

GIT_TIMEOUT_S = 900.0
_URL = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|[A-Za-z0-9._-]+@[^:/]+:)")


def is_url(repo: str) -> bool:
    """ssh://, git://, http(s)://, file:// or scp-like `git@desktop:inference/1cat-vllm.git` (not a local path)."""
    return bool(_URL.match(repo))


def mirror_path(root: Path, url: str) -> Path:
    """Where this host keeps its mirror of `url`: readable name plus a hash, so two forks never share one."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1])
    name = name.removesuffix(".git") or "repo"
    digest = hashlib.sha256(url.encode()).hexdigest()[:10]
    return root / f"{name}-{digest}.git"


def _git_env() -> dict[str, str]:
    # Never wait for a password or a host-key prompt on an unattended worker: fail, and say so.
    return {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_SSH_COMMAND": os.environ.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes -o ConnectTimeout=15"),
    }


def _git(
    *args: str, cwd: Path | None = None, timeout_s: float = GIT_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=_git_env(),
        check=False,
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One fetch at a time per mirror (two attempts on one host would trip over git's ref locks)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _unreachable(
    url: str, host: str, result: subprocess.CompletedProcess[str] | str
) -> EngineRepoUnavailable:
    detail = result if isinstance(result, str) else (result.stderr.strip() or result.stdout.strip())
    return EngineRepoUnavailable(
        f"engine repo {url} cannot be reached from host {host}: {detail.splitlines()[-1] if detail else 'no output'}. "
        f"Fix: check the URL, that host's access to it (ssh key or token for the worker's user, network), or "
        f"serve a reachable copy and file the ticket against that URL"
    )


def sync_mirror(url: str, root: Path, *, host: str, timeout_s: float = GIT_TIMEOUT_S) -> Path:
    """Clone `url` as a mirror under `root` the first time, fetch it every later time; returns the mirror."""
    path = mirror_path(root, url)
    with _locked(path):
        try:
            if (path / "HEAD").exists():
                result = _git("remote", "update", "--prune", cwd=path, timeout_s=timeout_s)
            else:
                partial = path.with_name(path.name + ".partial")
                shutil.rmtree(partial, ignore_errors=True)
                result = _git("clone", "--mirror", "--quiet", url, str(partial), timeout_s=timeout_s)
                if result.returncode == 0:
                    partial.rename(path)
                else:
                    shutil.rmtree(partial, ignore_errors=True)
        except subprocess.TimeoutExpired:
            raise _unreachable(url, host, f"git gave no answer within {timeout_s:g}s") from None
        if result.returncode != 0:
            raise _unreachable(url, host, result)
    return path


def resolve_commit(mirror: Path, commit: str, *, url: str, host: str) -> str:
    """The full sha of `commit` (a sha, branch or tag) in the mirror; a missing one is EngineRepoUnavailable."""
    result = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", cwd=mirror, timeout_s=60)
    if result.returncode != 0 or not result.stdout.strip():
        raise EngineRepoUnavailable(
            f"commit {commit!r} does not exist in engine repo {url} (mirror {mirror} on host {host}, just "
            f"fetched). Fix: push the commit to that repo, or correct the ticket's engine.base_commit"
        )
    return result.stdout.strip()
