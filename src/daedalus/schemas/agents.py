"""What an attempt hands a coding agent, and what comes back."""

from enum import StrEnum
from typing import Literal

from pydantic import Field

from daedalus.schemas._base import Model
from daedalus.schemas.steps import ResourceLimits
from daedalus.schemas.ticket import AgentSpec

CostSource = Literal["provider", "estimated", "unavailable"]


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
    title: str = ""
    spec: str = Field(default="", description="the ticket's spec text, as filed")
    constraints: list[str] = Field(default_factory=list)
    lessons: list[str] = Field(default_factory=list, description="lessons recorded for this engine")
    engine: str = ""
    idle_timeout_s: int = Field(
        default=600, gt=0, description="kill the agent after this long without an event"
    )
    max_turns: int = Field(default=40, ge=1)
    limits: ResourceLimits | None = Field(
        default=None,
        description="the host's step limits the agent's program and commands run under (daedalus.confinement); "
        "None only for a task made outside a worker",
    )
    cgroup_root: str | None = Field(
        default=None, description="the host's delegated cgroup v2 directory for steps (steps.cgroup_root)"
    )


class ExitReason(StrEnum):
    COMMITTED = "committed"
    NO_COMMIT = "no_commit"
    FAILED = "failed"
    TIMEOUT = "timeout"
    BUDGET_EXCEEDED = "budget_exceeded"
    FORBIDDEN = "forbidden"
    CANCELLED = "cancelled"


class AgentUsage(Model):
    """Tokens and dollars of one attempt. `cost_usd` is None unless someone actually knows it."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: float | None = None
    cost_source: CostSource = "unavailable"
    model: str | None = None
    turns: int = 0

    def cost_label(self) -> str:
        if self.cost_usd is None or self.cost_source == "unavailable":
            return "cost unavailable"
        return f"${self.cost_usd:.4f} ({self.cost_source})"


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
    duration_s: float | None = None
    artifacts: str | None = Field(default=None, description="the attempt's artifact directory")
    traps: list[str] = Field(
        default_factory=list,
        description="what the agent reported tripping over (`TRAP:` lines): recorded as lessons on the engine",
    )

    def summary(self) -> str:
        """One line per attempt, so attempts read side by side in an escalation."""
        commit = self.commit[:10] if self.commit else "no commit"
        claim = {True: "claimed success", False: "claimed failure", None: "no claim"}[self.claimed_success]
        tokens = f"{self.usage.input_tokens}+{self.usage.output_tokens} tok"
        detail = " ".join(self.detail.split())[:160]
        took = f", {self.duration_s:.0f}s" if self.duration_s is not None else ""
        return (
            f"attempt {self.attempt} [{self.agent.split(' ')[0]}] {self.exit_reason.value}: {commit}"
            f" ({self.diff_stat or 'no diff'}); {claim}; {tokens}, {self.usage.cost_label()}{took}"
            + (f" — {detail}" if detail else "")
        )


class SpecDraftRequest(Model):
    """A short request in the team's words, for the lead agent to turn into a draft ticket spec."""

    request: str = Field(min_length=1, max_length=4000)
    ticket_id: str | None = None
    host: str | None = None
    lessons: list[str] = Field(
        default_factory=list, max_length=200, description="lessons recorded for the host and engine concerned"
    )


class SpecDraft(Model):
    """A draft spec from the lead agent: validated, but a human or policy still approves it."""

    spec_json: str | None = Field(default=None, description="a TicketSpec as JSON; None when drafting failed")
    problems: list[str] = Field(default_factory=list)
    lead: str = Field(description="which lead produced it, or why none could")
    usage: AgentUsage = Field(default_factory=AgentUsage)


class Narrative(Model):
    """Narrative lines for a report; `by_model` False means the facts are shown as they are, without a model."""

    lines: list[str]
    by_model: bool
    note: str = ""
    usage: AgentUsage = Field(default_factory=AgentUsage)
