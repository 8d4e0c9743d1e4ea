"""Workspace.claim on real git repos: a ticket id filed again never takes an earlier filing's worktree or branch,
also when the engine repo it came from was replaced since (the demo makes its repo anew on each run)."""

from __future__ import annotations

import shutil
from pathlib import Path

from daedalus.activities.workspace import Workspace
from daedalus.agents import worktree as wt
from tests.support import make_engine_repo


def first_filing(workspace: Workspace, repo: Path) -> Path:
    workspace.claim("t1", 1, "filing-one", repo)
    path = workspace.worktree("t1", 1)
    wt.prepare_worktree(repo=repo, base_commit="main", worktree=path, branch=wt.branch_name("t1", 1))
    (path / "speed.txt").write_text("first filing's work\n")
    assert (path / ".git").is_dir(), "a private checkout: a git directory of its own"
    return path


def test_a_refiled_ticket_sets_the_earlier_worktree_aside_through_git(tmp_path: Path) -> None:
    workspace = Workspace(root=tmp_path / "ws", artifacts=tmp_path / "artifacts")
    repo = make_engine_repo(tmp_path / "repo")
    path = first_filing(workspace, repo)
    workspace.claim("t1", 1, "filing-two", repo)
    assert not path.exists()
    assert wt.branch_exists(repo, "daedalus/t1/attempt-1.filing-o")
    wt.prepare_worktree(repo=repo, base_commit="main", worktree=path, branch=wt.branch_name("t1", 1))
    assert (path / "speed.txt").read_text() == "28.9\n"


def test_a_worktree_of_a_replaced_repo_is_set_aside_not_an_error(tmp_path: Path) -> None:
    workspace = Workspace(root=tmp_path / "ws", artifacts=tmp_path / "artifacts")
    repo = make_engine_repo(tmp_path / "repo")
    path = first_filing(workspace, repo)
    shutil.rmtree(repo)
    make_engine_repo(repo)  # the same path, a new repo: it knows no worktree at `path`
    workspace.claim("t1", 1, "filing-two", repo)
    aside = path.with_name("attempt-1.filing-o")
    assert (aside / "speed.txt").read_text() == "first filing's work\n", "set aside, not deleted"
    wt.prepare_worktree(repo=repo, base_commit="main", worktree=path, branch=wt.branch_name("t1", 1))
    assert (path / "speed.txt").read_text() == "28.9\n"


def test_a_worktree_no_filing_claims_is_set_aside_too(tmp_path: Path) -> None:
    # What a claim that failed half-way left: the artifacts already set aside, the worktree still in place.
    workspace = Workspace(root=tmp_path / "ws", artifacts=tmp_path / "artifacts")
    repo = make_engine_repo(tmp_path / "repo")
    path = first_filing(workspace, repo)
    artifacts = tmp_path / "artifacts" / "tickets" / "t1" / "attempt-1"
    artifacts.rename(artifacts.with_name("attempt-1.filing-o"))
    workspace.claim("t1", 1, "filing-two", repo)
    assert not path.exists() and wt.branch_exists(repo, "daedalus/t1/attempt-1.earlier")
    wt.prepare_worktree(repo=repo, base_commit="main", worktree=path, branch=wt.branch_name("t1", 1))
    assert (path / "speed.txt").read_text() == "28.9\n", "a fresh worktree, not the first filing's work"


def test_two_checkouts_of_one_attempt_at_once_make_one_worktree(tmp_path: Path) -> None:
    """A retried activity whose first try still runs (it timed out while checking out) waits for it and finds
    its checkout, instead of making a second one beside it (git failed on its lock)."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.support import ticket_spec

    repo = make_engine_repo(tmp_path / "repo")
    workspace = Workspace(root=tmp_path / "ws", artifacts=tmp_path / "artifacts")
    spec = ticket_spec(repo, "h")
    for _ in range(5):
        shutil.rmtree(workspace.worktree(spec.id, 1), ignore_errors=True)
        with ThreadPoolExecutor(max_workers=4) as pool:
            bases = list(pool.map(lambda _: workspace.check_out_attempt(spec, 1, repo), range(4)))
        assert len(set(bases)) == 1
        assert (workspace.worktree(spec.id, 1) / "speed.txt").read_text() == "28.9\n"
