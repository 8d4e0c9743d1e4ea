"""What an attempt hands a coding agent, and what comes back."""

from enum import StrEnum
from typing import Literal

from pydantic import Field

from daedalus.schemas._base import Model
from daedalus.schemas.ticket import AgentSpec


class AgentTask(Model):
    """One attempt at a ticket, in its own worktree and branch off the ticket's base commit."""

    ticket_id: str
    attempt: int = Field(ge=1)
    agent: AgentSpec
    brief: str
    repo: str
    base_commit: str
    worktree: str
    branch: str
    allowed_paths: list[str] = Field(default_factory=lambda: ["."])
    timeout_s: int = Field(default=3600, gt=0)


class ExitReason(StrEnum):
    COMMITTED = "committed"
    NO_COMMIT = "no_commit"
    FAILED = "failed"
    TIMEOUT = "timeout"
    BUDGET_EXCEEDED = "budget_exceeded"
    FORBIDDEN = "forbidden"
    CANCELLED = "cancelled"


class AgentUsage(Model):
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    cost_source: Literal["provider", "estimated", "unavailable"] = "unavailable"


class AgentResult(Model):
    """Verified outcome of an attempt: a commit only counts if it is on the branch and touches allowed paths."""

    ticket_id: str
    attempt: int
    agent: str
    exit_reason: ExitReason
    branch: str
    commit: str | None = None
    diff_stat: str = ""
    transcript: str | None = Field(default=None, description="artifact path of the transcript / log")
    usage: AgentUsage = Field(default_factory=AgentUsage)
    claimed_success: bool | None = None
    detail: str = ""
