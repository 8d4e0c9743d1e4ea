"""Where a host keeps each attempt's worktree and artifacts."""

from dataclasses import dataclass
from pathlib import Path

from daedalus.agents import worktree as wt
from daedalus.paths import contained

FILING_MARKER = "filing"


@dataclass(frozen=True)
class Workspace:
    root: Path
    artifacts: Path

    def worktree(self, ticket_id: str, attempt: int) -> Path:
        return contained(self.root, "worktrees", ticket_id, f"attempt-{attempt}")

    def claim(self, ticket_id: str, attempt: int, filing: str, repo: Path) -> None:
        """Make attempt `attempt` of ticket `ticket_id` belong to this filing of the id.

        A ticket id filed again after its earlier workflow closed must not find that filing's result, worktree
        or branch and take them for its own: they are set aside (renamed with the old filing's id), not deleted.
        """
        artifacts = self.artifacts / "tickets" / ticket_id / f"attempt-{attempt}"
        marker = artifacts / FILING_MARKER
        owner = marker.read_text().strip() if marker.exists() else None
        if owner == filing:
            return
        if owner is not None or artifacts.exists():
            suffix = (owner or "earlier")[:8]
            artifacts.rename(artifacts.with_name(f"{artifacts.name}.{suffix}"))
            worktree, branch = self.worktree(ticket_id, attempt), wt.branch_name(ticket_id, attempt)
            if worktree.exists():
                wt.git("worktree", "remove", "--force", str(worktree), cwd=repo)
            if wt.branch_exists(repo, branch):
                wt.git("branch", "-m", branch, f"{branch}.{suffix}", cwd=repo)
        artifacts.mkdir(parents=True, exist_ok=True)
        marker.write_text(filing)

    def attempt_artifacts(self, ticket_id: str, attempt: int) -> Path:
        path = contained(self.artifacts, "tickets", ticket_id, f"attempt-{attempt}")
        path.mkdir(parents=True, exist_ok=True)
        return path
