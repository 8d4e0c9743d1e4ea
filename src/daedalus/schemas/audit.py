"""Audit events: one per state transition, append-only, idempotent on (workflow id, sequence number)."""

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from daedalus.schemas._base import Model


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
    CHILD = "child"
    CLOSED = "closed"


class AuditEvent(Model):
    workflow_id: str
    seq: int = Field(ge=1)
    ticket_id: str
    kind: AuditKind
    actor: str
    at: datetime
    status: str
    summary: str
    detail: dict[str, str] = Field(default_factory=dict)
