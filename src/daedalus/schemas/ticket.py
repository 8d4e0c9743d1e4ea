"""A ticket: its spec as filed, and its status as it lives."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

# Re-exported: a ticket's decisions are part of its schema; they live with every other subject's in decisions/.
from daedalus.decisions.schemas import PERSON_PATTERN as PERSON_PATTERN
from daedalus.decisions.schemas import Decision as Decision
from daedalus.decisions.schemas import DecisionKind as DecisionKind
from daedalus.decisions.schemas import DecisionRequest as DecisionRequest
from daedalus.decisions.schemas import Delegation as Delegation
from daedalus.decisions.schemas import DeskState, DispatchRule
from daedalus.schemas._base import Model, SpecModel
from daedalus.schemas.audit import TrailState
from daedalus.schemas.gates import GateResult, GateSpec
from daedalus.schemas.limits import (
    CHILDREN,
    GATES,
    HOST_PATTERN,
    LIST_ITEMS,
    PATCH_CHARS,
    SLUG_PATTERN,
    SPEC_BYTES,
    Brief,
    Command,
    DurationS,
    Finite,
    Line,
    Note,
    Title,
)

TICKET_ID_PATTERN = SLUG_PATTERN
PERSON_CHARS = 32


class TicketKind(StrEnum):
    FIX = "fix"
    FEATURE = "feature"
    MEASUREMENT = "measurement"
    INVESTIGATION = "investigation"
    HUNT = "hunt"
    UMBRELLA = "umbrella"


class RepoKind(StrEnum):
    """What the repository a ticket changes is: an engine's fork, or a plain one (a trainer, a tool). Not the
    serving engine whose presets a run uses (daedalus.schemas.engines.EngineKind, which spells it `llama.cpp`):
    these values are stored in every filed spec and history, so `llama_cpp` keeps its spelling here."""

    VLLM = "vllm"
    LLAMA_CPP = "llama_cpp"
    REPO = "repo"
    """A plain git repository (a trainer, a tool) that is not an inference engine."""


class EngineRef(SpecModel):
    """The engine a ticket changes: which fork, where its source lives, and the commit work starts from."""

    name: Line = Field(min_length=1)
    kind: RepoKind
    repo: Line = Field(
        min_length=1, description="a git URL, or a local path for tickets that run on this machine"
    )
    base_commit: Line = Field(default="HEAD", min_length=1)
    preset: Line | None = None


class AgentName(StrEnum):
    SCRIPTED = "scripted"
    CODEX = "codex"
    CLAUDE = "claude"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class AgentSpec(SpecModel):
    """Who does the work. The scripted agent applies `patch` and runs `commands`: for demos and tests only."""

    name: AgentName
    model: Line | None = None
    patch: str | None = Field(default=None, max_length=PATCH_CHARS)
    commands: list[Command] = Field(default_factory=list, max_length=LIST_ITEMS)
    budget_usd: Finite | None = Field(default=None, gt=0, le=100_000)

    @model_validator(mode="after")
    def _scripted_has_work(self) -> AgentSpec:
        if self.name is AgentName.SCRIPTED and not self.patch and not self.commands:
            raise ValueError("the scripted agent needs a `patch` or `commands` to apply")
        return self


class BuildSpec(SpecModel):
    command: Command
    timeout_s: DurationS = 1800


class ApprovalPolicy(SpecModel):
    """Who decides what. `delegates` lets a decider hand one kind of decision to someone else."""

    dispatch_requires_approval: bool = True
    deciders: list[Annotated[str, Field(max_length=PERSON_CHARS)]] = Field(
        default_factory=lambda: ["wayne"], min_length=1, max_length=LIST_ITEMS
    )
    delegates: dict[str, list[Annotated[str, Field(max_length=PERSON_CHARS)]]] = Field(
        default_factory=dict,
        max_length=LIST_ITEMS,
        description="decision kind -> people who may decide it on the deciders' behalf",
    )
    reminder_interval_s: DurationS = 3600
    inconclusive_reruns: int = Field(default=1, ge=0, le=5)

    @field_validator("deciders")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        return [n.lower() for n in names]

    @field_validator("delegates")
    @classmethod
    def _kinds(cls, delegates: dict[str, list[str]]) -> dict[str, list[str]]:
        known = {k.value for k in DecisionKind}
        for kind in delegates:
            if kind not in known:
                raise ValueError(f"cannot delegate unknown decision kind {kind!r}; known: {sorted(known)}")
        return {k: [n.lower() for n in v] for k, v in delegates.items()}


class TicketSpec(SpecModel):
    """A ticket as filed: a YAML file, a JSON body, or a Python object."""

    id: str = Field(pattern=TICKET_ID_PATTERN)
    title: Title
    parent: str | None = Field(default=None, pattern=TICKET_ID_PATTERN)
    kind: TicketKind = TicketKind.FIX
    engine: EngineRef | None = None
    host: str = Field(min_length=1, pattern=HOST_PATTERN)
    agent: AgentSpec | None = None
    spec: Brief = Field(default="", description="the brief the agent works from")
    build: BuildSpec | None = None
    gates: list[GateSpec] = Field(default_factory=list, max_length=GATES)
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    max_attempts: int = Field(default=3, ge=1, le=10)
    budget_usd: Finite | None = Field(
        default=None, gt=0, le=100_000, description="agent spend allowed across all attempts"
    )
    constraints: list[Line] = Field(default_factory=list, max_length=LIST_ITEMS)
    allowed_paths: list[Line] = Field(default_factory=lambda: ["."], max_length=LIST_ITEMS)
    exception_gates: list[str] = Field(
        default_factory=list,
        max_length=LIST_ITEMS,
        description="gates whose failure closes the ticket under an exception instead of failing it",
    )
    children: list[TicketSpec] = Field(default_factory=list, max_length=CHILDREN)

    @model_validator(mode="after")
    def _consistent(self) -> TicketSpec:
        names = [g.name for g in self.gates]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"gate names must be unique; repeated: {duplicates}")
        unknown = sorted(set(self.exception_gates) - set(names))
        if unknown:
            raise ValueError(
                f"exception_gates names gates this ticket does not have: {unknown}; gates: {names}"
            )
        for child in self.children:
            if child.parent not in (None, self.id):
                raise ValueError(
                    f"child ticket {child.id} names parent {child.parent}, but it is filed under {self.id}"
                )
        child_ids = [c.id for c in self.children]
        if self.id in child_ids or len(set(child_ids)) != len(child_ids):
            raise ValueError(f"child ticket ids must be unique and differ from the parent's: {child_ids}")
        if self.agent is None and not self.children and not self.gates:
            raise ValueError(
                "a ticket without an agent must be an umbrella over children or only measure gates"
            )
        if self.agent is None and self.build is not None and not self.gates:
            raise ValueError(
                "a ticket without an agent builds only what its gates measure (its engine at its children's "
                "accepted commit, or its base); give it gates or drop its build"
            )
        size = len(self.model_dump_json())
        if size > SPEC_BYTES:
            raise ValueError(
                f"ticket {self.id} is {size // 1024} KiB as JSON, more than the {SPEC_BYTES // 1024} KiB a "
                f"ticket may carry through its workflow; put long briefs, patches and data in the repository "
                f"and reference them from the spec"
            )
        return self

    def tree(self) -> list[TicketSpec]:
        """The ticket and all its sub-tickets, depth first."""
        return [self, *(d for child in self.children for d in child.tree())]

    def with_parent(self) -> list[TicketSpec]:
        """Children with `parent` filled in."""
        return [c.model_copy(update={"parent": self.id}) for c in self.children]


class TicketStatus(StrEnum):
    DRAFT = "draft"
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING_CHILDREN = "running_children"
    DISPATCHED = "dispatched"
    BUILDING = "building"
    GATING = "gating"
    AWAITING_DECISION = "awaiting_decision"
    PASSED = "passed"
    FAILED = "failed"
    CLOSED_UNDER_EXCEPTION = "closed_under_exception"
    STOPPED_BY_RULES = "stopped_by_rules"
    CANCELLED = "cancelled"
    TERMINATED = "terminated"
    """Ended by `daedalus ticket terminate` (a wedged workflow); written by the service layer, never the workflow."""

    @property
    def is_closed(self) -> bool:
        return self in CLOSED_STATUSES


CLOSED_STATUSES = frozenset(
    {
        TicketStatus.PASSED,
        TicketStatus.FAILED,
        TicketStatus.CLOSED_UNDER_EXCEPTION,
        TicketStatus.STOPPED_BY_RULES,
        TicketStatus.CANCELLED,
        TicketStatus.TERMINATED,
    }
)


class AttemptOutcome(StrEnum):
    COMMITTED = "committed"
    NO_COMMIT = "no_commit"
    AGENT_FAILED = "agent_failed"
    BUILD_FAILED = "build_failed"
    GATES_FAILED = "gates_failed"
    GATES_PASSED = "gates_passed"
    CANCELLED = "cancelled"


class AttemptSummary(Model):
    number: int
    branch: str
    commit: str | None = None
    outcome: AttemptOutcome
    detail: str = ""
    gate_results: list[GateResult] = Field(default_factory=list)
    cost_usd: float | None = None
    cost_source: str = "unavailable"


class SpecAmendment(SpecModel):
    """A change to a live ticket's spec; applies from the next attempt on."""

    amended_by: str = Field(pattern=PERSON_PATTERN)
    spec: Brief | None = None
    constraints: list[Line] | None = Field(default=None, max_length=LIST_ITEMS)
    max_attempts: int | None = Field(default=None, ge=1, le=10)
    note: Note = ""

    def changes(self) -> dict[str, object]:
        """The spec fields this amendment sets."""
        fields = {"spec": self.spec, "constraints": self.constraints, "max_attempts": self.max_attempts}
        return {name: value for name, value in fields.items() if value is not None}


class CancelRequest(SpecModel):
    requested_by: str = Field(pattern=PERSON_PATTERN)
    reason: Note = Field(min_length=1)


class TerminateRequest(SpecModel):
    """The last resort for a wedged ticket (`daedalus ticket terminate`): who asks, and why."""

    requested_by: str = Field(pattern=PERSON_PATTERN)
    reason: Note = Field(min_length=1)


class Granted(Model):
    """What the decider's retries granted beyond the spec, and how many attempts were made at the last one."""

    extra_attempts: int = Field(default=0, ge=0)
    extra_budget_usd: float = Field(default=0.0, ge=0)
    retry_granted_after: int = Field(default=0, ge=0)


class TicketCarry(Model):
    """Everything a ticket knows, in one model: what one workflow run hands the next across continue-as-new."""

    status: TicketStatus = TicketStatus.DRAFT
    attempts: list[AttemptSummary] = Field(default_factory=list)
    children: dict[str, TicketStatus] = Field(default_factory=dict)
    outcome_reason: str = ""
    dispatch_approved: bool = False
    granted: Granted = Field(default_factory=Granted)
    escalation_why: str = Field(default="", description="why the pending escalation was asked")
    desk: DeskState = Field(default_factory=DeskState)
    trail: TrailState = Field(default_factory=TrailState)
    continued: int = Field(default=0, ge=0, description="how many times the ticket continued as new")
    accepted_commit: str | None = Field(
        default=None, description="the last sub-ticket's accepted commit, which the next one builds on"
    )


class HostFacts(Model):
    """What a ticket's workflow knows of a host it works on, copied from hosts.yaml when the ticket is filed."""

    schedule_to_start_s: float = Field(
        gt=0, description="how long a step may wait for a worker before the host counts as unavailable"
    )
    gpus: int = Field(default=0, ge=0, description="GPUs a gate holds a lease on; none needs no lease")


class TicketInput(Model):
    """The one argument of TicketWorkflow."""

    spec: TicketSpec
    filed_by: str = "cli"
    hosts: dict[str, HostFacts] = Field(
        default_factory=dict,
        description="the hosts the ticket and its sub-tickets name; empty for tickets filed before the registry",
    )
    history_limit: int = Field(
        default=2000, ge=30, le=9000, description="continue as new, at a reminder, past this many events"
    )
    carry: TicketCarry | None = Field(default=None, description="set only by the ticket continuing as new")
    dispatch: DispatchRule | None = Field(
        default=None,
        description="the server policy's dispatch rule, resolved at filing; None: the spec's own (tickets filed "
        "before the policy, or with no policy configured)",
    )
    requests_before: dict[str, int] = Field(
        default_factory=dict,
        description="ticket id (this one and its sub-tickets) -> decision requests earlier filings of it asked: "
        "a re-filed ticket numbers its requests on from there, so a request id names one request ever",
    )


class TicketState(Model):
    """The full status of a live or closed ticket, as the `status` query returns it."""

    spec: TicketSpec
    status: TicketStatus
    attempts: list[AttemptSummary] = Field(default_factory=list)
    pending_decision: DecisionRequest | None = None
    decisions: list[Decision] = Field(default_factory=list)
    children: dict[str, TicketStatus] = Field(default_factory=dict)
    outcome_reason: str = ""
    audit_seq: int = 0
    continued: int = 0


TicketSpec.model_rebuild()
