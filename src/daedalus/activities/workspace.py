"""Where a host keeps each attempt's worktree and artifacts."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workspace:
    root: Path
    artifacts: Path

    def worktree(self, ticket_id: str, attempt: int) -> Path:
        return self.root / "worktrees" / ticket_id / f"attempt-{attempt}"

    def attempt_artifacts(self, ticket_id: str, attempt: int) -> Path:
        path = self.artifacts / "tickets" / ticket_id / f"attempt-{attempt}"
        path.mkdir(parents=True, exist_ok=True)
        return path
