"""Where a host keeps each attempt's worktree and artifacts."""

from dataclasses import dataclass
from pathlib import Path

from daedalus.agents import worktree as wt
from daedalus.hosts.mirrors import EngineRepoUnavailable, is_url, mirror_path, resolve_commit, sync_mirror
from daedalus.paths import contained
from daedalus.schemas.ticket import EngineRef

FILING_MARKER = "filing"


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
        So is a worktree or branch no filing's marker claims (a claim that failed half-way), and a worktree left
        by a repo that was since replaced (the demo's, made anew on each run), which git cannot remove.
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
        made = repo.exists()  # a host's mirror of a URL is made by the attempt's sync, after this
        if made and wt.is_worktree_of(repo, worktree):
            wt.git("worktree", "remove", "--force", str(worktree), cwd=repo)
        elif worktree.exists():
            worktree.rename(worktree.with_name(f"{worktree.name}.{suffix}"))
        if made and wt.branch_exists(repo, branch):
            wt.git("branch", "-m", branch, f"{branch}.{suffix}", cwd=repo)
        artifacts.mkdir(parents=True, exist_ok=True)
        marker.write_text(filing)

    def attempt_artifacts(self, ticket_id: str, attempt: int) -> Path:
        path = contained(self.artifacts, "tickets", ticket_id, f"attempt-{attempt}")
        path.mkdir(parents=True, exist_ok=True)
        return path
