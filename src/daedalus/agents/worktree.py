"""An attempt's worktree: a private checkout of the engine repo that the agent owns, and the host's commit of it.

The agent works in a directory of its own with a git directory of its own (`<worktree>/.git`, made here): it may
commit, branch, rewrite its config or its HEAD there, and none of it reaches the host's repository. The host's
objects are borrowed read-only (`objects/info/alternates`; the sandbox mounts them read-only), so a checkout of
a large repo costs no copy, and nothing the agent writes lands in the store the host's branches live in.

When the attempt ends, the host takes the worktree's files (never its git directory: an agent-written config
could run code in any git the host starts there) as a tree, checks it (`check_tree`), and commits it onto the
attempt's branch in the host's repository itself: `daedalus/<ticket>/attempt-<n>`, off the base commit.

Every git the host runs names its repository explicitly (`--git-dir`) and reads no global or system config.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from daedalus.errors import GitError, OutsideAllowed, TreeRefused

# The host's git reads the repository's own config and nothing else: no ~/.gitconfig, no /etc/gitconfig.
HOST_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
}
COMMITTER = {
    "GIT_AUTHOR_NAME": "daedalus",
    "GIT_AUTHOR_EMAIL": "daedalus@daedalus.local",
    "GIT_COMMITTER_NAME": "daedalus",
    "GIT_COMMITTER_EMAIL": "daedalus@daedalus.local",
}
GITLINK_MODE = "160000"
MAX_FILE_BYTES = 64 * 1024 * 1024
"""A file an attempt may commit: larger ones are a build's output left behind, not a change."""


def git(
    *args: str,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> str:
    """Run the host's git; GitError with git's own message when it fails."""
    result = subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        input=stdin,
        env={**os.environ, **HOST_GIT_ENV, **(env or {})},
    )
    if result.returncode != 0:
        where = f" in {cwd}" if cwd else ""
        raise GitError(
            f"git {' '.join(args)} failed{where}: {result.stderr.strip() or result.stdout.strip()}"
        )
    return result.stdout.strip()


def git_dir(repo: Path) -> Path:
    """The repository's git directory: `<repo>/.git` of a checkout, the repo itself for a bare mirror."""
    dot_git = repo / ".git"
    return dot_git if dot_git.is_dir() else repo


def in_repo(repo: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    """git on the host's repository, by its git directory (never discovered from a working directory)."""
    return git(f"--git-dir={git_dir(repo)}", *args, env=env, stdin=stdin)


def objects_dir(repo: Path) -> Path:
    """Where the repository's objects are: what an attempt's private checkout borrows, read-only."""
    return (git_dir(repo) / "objects").resolve()


def branch_name(ticket_id: str, attempt: int) -> str:
    return f"daedalus/{ticket_id}/attempt-{attempt}"


def resolve(repo: Path, commit: str) -> str:
    return in_repo(repo, "rev-parse", "--verify", f"{commit}^{{commit}}")


def branch_exists(repo: Path, branch: str) -> bool:
    probe = ["git", f"--git-dir={git_dir(repo)}", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"]
    return subprocess.run(probe, capture_output=True, env={**os.environ, **HOST_GIT_ENV}).returncode == 0


def branch_head(repo: Path, branch: str) -> str | None:
    return resolve(repo, f"refs/heads/{branch}") if branch_exists(repo, branch) else None


def check_out(*, repo: Path, commit: str, dest: Path, branch: str | None = None) -> str:
    """Make `dest` a private checkout of `commit` (on `branch`, if given); returns the commit's sha.

    `dest/.git` is a repository of its own whose objects are the host repository's, borrowed; nothing written
    there reaches the host's repository. A `dest` that is already such a checkout is kept as it is (a retried
    attempt finds its agent's work again)."""
    sha = resolve(repo, commit)
    if (dest / ".git" / "objects" / "info" / "alternates").is_file():
        return sha
    if dest.exists():
        shutil.rmtree(dest)  # half made by a worker that died while making it
    dest.mkdir(parents=True)
    own = dest / ".git"
    git("init", "--quiet", str(dest))
    (own / "objects" / "info" / "alternates").write_text(f"{objects_dir(repo)}\n")
    ref = f"refs/heads/{branch}" if branch else None
    if ref is None:
        git(f"--git-dir={own}", "update-ref", "--no-deref", "HEAD", sha)
    else:
        git(f"--git-dir={own}", "update-ref", ref, sha)
        git(f"--git-dir={own}", "symbolic-ref", "HEAD", ref)
    git(f"--git-dir={own}", f"--work-tree={dest}", "read-tree", "--reset", "-u", "HEAD")
    return sha


def prepare_worktree(*, repo: Path, base_commit: str, worktree: Path, branch: str) -> str:
    """An attempt's start: its branch at the base commit in the host's repository (kept if it exists), and its
    worktree, a private checkout of that branch (kept if it exists). Returns the base commit's sha."""
    base = resolve(repo, base_commit)
    if not branch_exists(repo, branch):
        in_repo(repo, "update-ref", f"refs/heads/{branch}", base, "")
    check_out(repo=repo, commit=branch_head(repo, branch) or base, dest=worktree, branch=branch)
    return base


@dataclass(frozen=True)
class Captured:
    """What an attempt left in its worktree, as the host committed it."""

    commit: str | None
    """The new commit on the attempt's branch; None when the files equal the base commit's."""
    paths: list[str]
    """Paths that differ from the base commit."""
    diff_stat: str


def capture(
    *, repo: Path, worktree: Path, base: str, branch: str, message: str, allowed: list[str]
) -> Captured:
    """Commit the worktree's files onto `branch` in the host's repository, as the host (hooks never run).

    The files are read by the host's git with the host's repository and a fresh index; the worktree's own
    `.git` is never opened (git never takes a directory named `.git` for a file of the tree)."""
    with tempfile.TemporaryDirectory(prefix="daedalus-index-") as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index"), "GIT_WORK_TREE": str(worktree)}
        in_repo(repo, "read-tree", base, env=env)
        in_repo(repo, "add", "--all", "--", ".", env=env)
        tree = in_repo(repo, "write-tree", env=env)
    changes = _changes(repo, base, tree)
    if not changes:
        return Captured(commit=None, paths=[], diff_stat="")
    _check(repo, changes)
    paths = [path for path, _mode, _sha in changes]
    stat = in_repo(repo, "diff-tree", "--shortstat", base, tree)
    outside = outside_allowed(paths, allowed)
    if outside:
        raise OutsideAllowed(outside, stat)
    parent = branch_head(repo, branch) or base
    if parent != base and in_repo(repo, "rev-parse", f"{parent}^{{tree}}") == tree:
        return Captured(commit=parent, paths=paths, diff_stat=stat)  # committed before a worker died
    commit = in_repo(repo, "commit-tree", tree, "-p", parent, "-F", "-", env=COMMITTER, stdin=message)
    in_repo(repo, "update-ref", f"refs/heads/{branch}", commit, parent)
    return Captured(commit=commit, paths=paths, diff_stat=stat)


def _changes(repo: Path, base: str, tree: str) -> list[tuple[str, str, str]]:
    """(path, new mode, new sha) of every entry that differs between `base` and `tree`."""
    raw = in_repo(repo, "diff-tree", "-r", "-z", "--no-renames", base, tree).split("\0")
    changes = []
    for meta, path in zip(raw[0::2], raw[1::2], strict=False):
        if not meta.startswith(":"):
            continue
        _old_mode, new_mode, _old_sha, new_sha, _status = meta[1:].split()
        changes.append((path, new_mode, new_sha))
    return changes


def _check(repo: Path, changes: list[tuple[str, str, str]]) -> None:
    """What an attempt may commit: no nested repositories (gitlinks), no file over MAX_FILE_BYTES."""
    for path, mode, _sha in changes:
        if mode == GITLINK_MODE:
            raise TreeRefused(f"the worktree holds a nested git repository at {path!r}; remove it")
    added = [(path, sha) for path, mode, sha in changes if set(sha) != {"0"}]
    if not added:
        return
    sizes = in_repo(repo, "cat-file", "--batch-check=%(objectsize)", stdin="\n".join(sha for _, sha in added))
    for (path, _sha), size in zip(added, sizes.splitlines(), strict=True):
        if int(size) > MAX_FILE_BYTES:
            raise TreeRefused(
                f"{path!r} is {int(size) / 2**20:.0f} MiB, over the {MAX_FILE_BYTES // 2**20} MiB a commit may "
                f"hold; a build output left in the worktree? add it to .gitignore"
            )


def changed_paths(repo: Path, base: str, commit: str) -> list[str]:
    out = in_repo(repo, "diff-tree", "-r", "--no-commit-id", "--name-only", "-z", base, commit)
    return [p for p in out.split("\0") if p]


def diff_stat(repo: Path, base: str, commit: str) -> str:
    return in_repo(repo, "diff-tree", "--shortstat", base, commit)


def outside_allowed(paths: list[str], allowed: list[str]) -> list[str]:
    """Paths not under any allowed prefix ('.' allows everything in the worktree)."""
    if "." in allowed:
        return []
    prefixes = [a.rstrip("/") + "/" for a in allowed]
    return [p for p in paths if p not in allowed and not any(p.startswith(pre) for pre in prefixes)]
