"""What the API answers with. Table rows never leave the store: each is copied into one of these."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from daedalus.schemas._base import Model
from daedalus.schemas.gates import LeaseRecord
from daedalus.schemas.ticket import TicketState

if TYPE_CHECKING:
    from daedalus.store.tables import DecisionRow


class Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class TicketFiled(Public):
    ticket_id: str
    workflow_id: str
    run_id: str | None
    filed_by: str


class TicketSummary(Public):
    """A row of the tickets projection (the store), as of its latest audit event."""

    ticket_id: str
    workflow_id: str
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
    filed_at: datetime
    updated_at: datetime
    closed_at: datetime | None
    waiting_on_host: str | None = None
    """Set while its step is queued on a host no worker polls: "queued for host-mavis since 22:03 UTC; ..."."""


class VerdictPublic(Public):
    attempt: int
    gate: str
    metric: str
    verdict: str
    rule: str
    reason: str
    method: str
    median: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float
    samples: list[float]
    host: str
    commit: str
    recorded_at: datetime
    lease: LeaseRecord | None = None
    """The GPU lease the measurement ran under (None: the host has no GPUs, or it ran before leases)."""


class TicketDetail(Public):
    ticket_id: str
    workflow_id: str
    live: TicketState | None
    """Temporal's answer to the `state` query; None when Temporal could not answer in time."""
    projection: TicketSummary | None
    """The store's row; None until the first audit event is written."""
    verdicts: list[VerdictPublic]


class AuditEventPublic(Public):
    workflow_id: str
    run_id: str
    seq: int
    ticket_id: str
    kind: str
    actor: str
    at: datetime
    status: str
    summary: str
    detail: dict[str, str]


class DecisionPublic(Public):
    request_id: str
    ticket_id: str
    kind: str
    question: str
    options: list[str]
    deciders: list[str]
    requested_at: datetime
    option: str | None
    decided_by: str | None
    channel: str | None
    note: str
    decided_at: datetime | None


class Delegated(Public):
    ticket_id: str
    kind: str
    delegates: list[str]


class Identity(Public):
    person: str


class QuestionAsked(Model):
    """POST /questions's answer."""

    question_id: str
    workflow_id: str
    asked_by: str
    deciders: list[str]


class QuestionPublic(Model):
    """A question's request as the store holds it (GET /questions)."""

    request_id: str
    question: str
    options: list[str]
    deciders: list[str]
    requested_at: datetime
    option: str | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    note: str = ""
    open: bool = Field(description="still waiting for an answer")

    @classmethod
    def from_row(cls, row: DecisionRow) -> QuestionPublic:
        """A question's decision row from the store, as the API answers it (and the local CLI prints it)."""
        return cls(
            request_id=row.request_id,
            question=row.question,
            options=row.options,
            deciders=row.deciders,
            requested_at=row.requested_at,
            option=row.option,
            decided_by=row.decided_by,
            decided_at=row.decided_at,
            note=row.note,
            open=row.decided_at is None,
        )


class RunStarted(Model):
    """POST /training's answer."""

    name: str
    workflow_id: str
    run_id: str | None
    host: str
    started_by: str
