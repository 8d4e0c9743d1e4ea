"""Git worktrees for attempts: one branch `daedalus/<ticket>/attempt-<n>` per attempt, off the base commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

from daedalus.errors import GitError


def git(*args: str, cwd: Path | str) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GitError(
            f"git {' '.join(args)} failed in {cwd}: {result.stderr.strip() or result.stdout.strip()}"
        )
    return result.stdout.strip()


def branch_name(ticket_id: str, attempt: int) -> str:
    return f"daedalus/{ticket_id}/attempt-{attempt}"


def prepare_worktree(*, repo: Path, base_commit: str, worktree: Path, branch: str) -> str:
    """Create (or find again) the attempt's worktree; returns the resolved base commit sha."""
    base = git("rev-parse", "--verify", f"{base_commit}^{{commit}}", cwd=repo)
    if worktree.exists() and (worktree / ".git").exists():
        return base
    worktree.parent.mkdir(parents=True, exist_ok=True)
    if branch_exists(repo, branch):
        git("worktree", "add", str(worktree), branch, cwd=repo)
    else:
        git("worktree", "add", "-b", branch, str(worktree), base, cwd=repo)
    return base


def is_worktree_of(repo: Path, path: Path) -> bool:
    """Whether `path` is one of `repo`'s registered worktrees (a directory left by another repo is not)."""
    listed = git("worktree", "list", "--porcelain", cwd=repo).splitlines()
    return f"worktree {path.resolve()}" in listed


def branch_exists(repo: Path, branch: str) -> bool:
    probe = ["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"]
    return subprocess.run(probe, cwd=repo, capture_output=True).returncode == 0


def commits_since(worktree: Path, base: str) -> list[str]:
    out = git("rev-list", f"{base}..HEAD", cwd=worktree)
    return out.split() if out else []


def changed_paths(worktree: Path, base: str) -> list[str]:
    out = git("diff", "--name-only", f"{base}..HEAD", cwd=worktree)
    return out.splitlines() if out else []


def diff_stat(worktree: Path, base: str) -> str:
    return git("diff", "--shortstat", f"{base}..HEAD", cwd=worktree)


def outside_allowed(paths: list[str], allowed: list[str]) -> list[str]:
    """Paths not under any allowed prefix ('.' allows everything in the worktree)."""
    if "." in allowed:
        return []
    prefixes = [a.rstrip("/") + "/" for a in allowed]
    return [p for p in paths if p not in allowed and not any(p.startswith(pre) for pre in prefixes)]


def commit_all(worktree: Path, message: str, *, author: str = "daedalus") -> bool:
    """Commit every change left in the worktree; False when there was nothing to commit."""
    git("add", "-A", cwd=worktree)
    if not git("status", "--porcelain", cwd=worktree):
        return False
    git(
        "-c",
        f"user.name={author}",
        "-c",
        f"user.email={author}@daedalus.local",
        "commit",
        "-q",
        "--no-verify",
        "-m",
        message,
        cwd=worktree,
    )
    return True
