"""Where a host keeps each attempt's worktree and artifacts, and the checkouts its steps run in."""

import contextlib
import fcntl
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from daedalus.agents import worktree as wt
from daedalus.errors import GitError
from daedalus.hosts.mirrors import EngineRepoUnavailable, is_url, mirror_path, resolve_commit, sync_mirror
from daedalus.paths import contained
from daedalus.schemas.ticket import EngineRef, TicketSpec

FILING_MARKER = "filing"
CHECKOUT_RECORD = "checkout.json"
"""Which host repository an attempt's worktree borrows from: written by the host, never read from the worktree."""


@dataclass(frozen=True)
class Workspace:
    root: Path
    artifacts: Path

    @property
    def mirrors(self) -> Path:
        return self.root / "mirrors"

    def repo_path(self, engine: EngineRef) -> Path:
        """Where the engine's git repo is on this host, without touching it: the checkout given as a local
        path, or this host's mirror of a URL."""
        if is_url(engine.repo):
            return mirror_path(self.mirrors, engine.repo)
        return Path(engine.repo).expanduser()

    def sync_engine(self, engine: EngineRef, host: str) -> Path:
        """The repo an attempt's worktree is made from, up to date and holding the base commit.

        A URL is mirrored (`git clone --mirror` the first time, fetched every time after); a local path must be
        a checkout. Raises EngineRepoUnavailable (an environment error, not the agent's) with what to fix.
        """
        if is_url(engine.repo):
            repo = sync_mirror(engine.repo, self.mirrors, host=host)
        else:
            repo = Path(engine.repo).expanduser()
            if not (repo / ".git").exists():
                raise EngineRepoUnavailable(
                    f"engine repo {repo} is not a git checkout on host {host}; clone it there first, or give "
                    f"the engine's URL (the host then keeps a mirror of it)"
                )
        resolve_commit(repo, engine.base_commit, url=engine.repo, host=host)
        return repo

    def worktree(self, ticket_id: str, attempt: int) -> Path:
        return contained(self.root, "worktrees", ticket_id, f"attempt-{attempt}")

    def claim(self, ticket_id: str, attempt: int, filing: str, repo: Path) -> None:
        """Make attempt `attempt` of ticket `ticket_id` belong to this filing of the id.

        A ticket id filed again after its earlier workflow closed must not find that filing's result, worktree
        or branch and take them for its own: they are set aside (renamed with the old filing's id), not deleted.
        So is a worktree or branch no filing's marker claims (a claim that failed half-way).
        """
        artifacts = self.artifacts / "tickets" / ticket_id / f"attempt-{attempt}"
        marker = artifacts / FILING_MARKER
        owner = marker.read_text().strip() if marker.exists() else None
        if owner == filing:
            return
        suffix = (owner or "earlier")[:8]
        if artifacts.exists():
            artifacts.rename(artifacts.with_name(f"{artifacts.name}.{suffix}"))
        worktree, branch = self.worktree(ticket_id, attempt), wt.branch_name(ticket_id, attempt)
        if worktree.exists():
            worktree.rename(worktree.with_name(f"{worktree.name}.{suffix}"))
        if repo.exists() and wt.branch_exists(
            repo, branch
        ):  # a host's mirror is made by the sync, after this
            wt.in_repo(repo, "branch", "-m", branch, f"{branch}.{suffix}")
        artifacts.mkdir(parents=True, exist_ok=True)
        marker.write_text(filing)

    def check_out_attempt(self, spec: TicketSpec, attempt: int, repo: Path) -> str:
        """The attempt's branch at the base commit in the host's repo, and its worktree: a private checkout of
        the branch (kept if it exists: a retry finds the agent's work again). Returns the base commit's sha.

        One checkout at a time per attempt: a retry of an activity that timed out while its checkout was being
        made (its thread still running) waits for it, then finds it made, instead of making it again beside it."""
        if spec.engine is None:
            raise GitError(f"ticket {spec.id} names no engine repository to check out")
        with self._checkout_lock(spec.id, attempt):
            self._record_checkout(spec.id, attempt, repo)
            return wt.prepare_worktree(
                repo=repo,
                base_commit=spec.engine.base_commit,
                worktree=self.worktree(spec.id, attempt),
                branch=wt.branch_name(spec.id, attempt),
            )

    @contextlib.contextmanager
    def _checkout_lock(self, ticket_id: str, attempt: int) -> Iterator[None]:
        lock = self.attempt_artifacts(ticket_id, attempt) / "checkout.lock"
        with lock.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def check_out_attempt_result(self, ticket_id: str, attempt: int, repo: Path, commit: str) -> None:
        """The worktree made anew as a clean checkout of the attempt's commit: the build and the gates run on
        what was committed, never on what the agent left beside it (or wrote into its own git)."""
        worktree = self.worktree(ticket_id, attempt)
        if worktree.exists():
            shutil.rmtree(worktree)
        wt.check_out(repo=repo, commit=commit, dest=worktree, branch=wt.branch_name(ticket_id, attempt))

    def check_out_as_it_stands(self, ticket_id: str, attempt: int, engine: EngineRef, host: str) -> None:
        """A gate of a ticket without an agent measures its engine at the base commit."""
        repo = self.sync_engine(engine, host)
        self._record_checkout(ticket_id, attempt, repo)
        wt.check_out(repo=repo, commit=engine.base_commit, dest=self.worktree(ticket_id, attempt))

    def _record_checkout(self, ticket_id: str, attempt: int, repo: Path) -> None:
        record = self.attempt_artifacts(ticket_id, attempt) / CHECKOUT_RECORD
        record.write_text(json.dumps({"repo": str(repo.resolve())}))

    def borrowed_objects(self, ticket_id: str, attempt: int) -> Path | None:
        """The object store the attempt's worktree borrows, from the host's own record of its checkout."""
        record = self.attempt_artifacts(ticket_id, attempt) / CHECKOUT_RECORD
        if not record.is_file():
            return None
        return wt.objects_dir(Path(json.loads(record.read_text())["repo"]))

    def attempt_artifacts(self, ticket_id: str, attempt: int) -> Path:
        path = contained(self.artifacts, "tickets", ticket_id, f"attempt-{attempt}")
        path.mkdir(parents=True, exist_ok=True)
        return path
