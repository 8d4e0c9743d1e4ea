"""Audit events: one per state transition, append-only, idempotent on (workflow id, sequence number)."""

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from daedalus.decisions.schemas import Decision, DecisionRequest
from daedalus.schemas._base import Model
from daedalus.schemas.gates import GateResult


class AuditKind(StrEnum):
    FILED = "filed"
    TRANSITION = "transition"
    DECISION_REQUESTED = "decision_requested"
    DECISION_REMINDER = "decision_reminder"
    DECIDED = "decided"
    ATTEMPT = "attempt"
    BUILD = "build"
    GATE = "gate"
    AMENDED = "amended"
    DELEGATED = "delegated"
    CHILD = "child"
    CLOSED = "closed"
    TRAINING = "training"
    DEATH = "death"
    HUNT = "hunt"
    EVALUATION = "evaluation"
    DEPLOYMENT = "deployment"
    RULED = "ruled"
    """A question's answer made a standing ruling (detail `ruling`: the Ruling as JSON)."""


TEMPORAL_ACTOR = "temporal"
"""The actor of what Temporal did without a person deciding it in Daedalus (a cancellation sent to Temporal)."""
CANCELLED_THROUGH = "cancelled_through"
"""Detail key of a close that Temporal's cancellation caused; the audit writer adds what Temporal recorded of
it (`CANCEL_CLIENT`, `CANCEL_REASON`)."""
WITHDRAWS_REQUEST = "withdraws_request"
"""Detail key of an event that withdraws one pending request of its subject while the subject lives on (a
training run's deployment proposal that gives way to its escalation); a close withdraws all that are left."""
CANCEL_CLIENT = "cancel_requested_by_client"
CANCEL_REASON = "cancel_reason"


class AuditEvent(Model):
    """One transition. (run_id, seq) identifies it: a retried write of the same event is a no-op."""

    workflow_id: str
    run_id: str = Field(description="the first run id of the workflow: unique per filing of a ticket id")
    seq: int = Field(ge=1)
    ticket_id: str = Field(description="the subject: a ticket id, or `training-<name>` for a training run")
    kind: AuditKind
    actor: str
    at: datetime
    status: str
    summary: str
    detail: dict[str, str] = Field(default_factory=dict)


class TicketSnapshot(Model):
    """The ticket's projection as of one audit event."""

    ticket_id: str
    workflow_id: str
    run_id: str
    title: str
    parent: str | None
    kind: str
    host: str
    engine: str | None
    agent: str | None
    status: str
    attempts: int
    awaiting: str | None
    outcome_reason: str
    spec: dict[str, object] | None = Field(default=None, description="sent when filed or amended only")


class AuditRecord(Model):
    """One state transition and everything it writes, applied in one transaction, at most once."""

    event: AuditEvent
    ticket: TicketSnapshot | None = Field(
        default=None,
        description="the ticket projection after this event; None for non-ticket subjects (training runs)",
    )
    decision_request: DecisionRequest | None = None
    decision: Decision | None = None
    attempt: int = 0
    gate_results: list[GateResult] = Field(default_factory=list)


class AuditBatch(Model):
    """Consecutive records of one trail, in sequence order, applied in one transaction."""

    records: list[AuditRecord] = Field(min_length=1)


class TrailHead(Model):
    """How far a workflow's trail got, as the workflow itself knows it (its `audit_head` query): the anchor that
    `daedalus audit verify` holds the store against, so a truncated or deleted trail shows."""

    subject: str
    workflow_id: str
    run_id: str = Field(description="the workflow's first run id: every event of its chain carries it")
    seq: int = Field(ge=0, description="the last event the store acknowledged writing")


class TrailState(Model):
    """What a workflow's audit trail hands the next run across continue-as-new (every write has finished)."""

    seq: int = Field(
        default=0, ge=0, description="the last event's sequence number; (first run id, seq) spans the chain"
    )
    status: str = Field(default="", description="the status the last written event carries")
