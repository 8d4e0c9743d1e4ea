"""SQLModel tables. Rows are written only through `daedalus.store.records.apply`, one audit event at a time."""

from datetime import datetime

from sqlalchemy import JSON, Column, UniqueConstraint
from sqlmodel import Field, SQLModel


class TicketRow(SQLModel, table=True):
    """The tickets projection: the latest state of each ticket, rebuilt from its audit events."""

    __tablename__ = "tickets"

    ticket_id: str = Field(primary_key=True)
    workflow_id: str = Field(index=True)
    run_id: str
    title: str
    parent: str | None = Field(default=None, index=True)
    kind: str
    host: str
    engine: str | None = None
    agent: str | None = None
    status: str = Field(index=True)
    attempts: int = 0
    awaiting: str | None = None
    outcome_reason: str = ""
    filed_at: datetime
    updated_at: datetime
    last_seq: int = Field(default=0, description="sequence number of the audit event the row reflects")
    closed_at: datetime | None = None
    spec: dict[str, object] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class AuditEventRow(SQLModel, table=True):
    """Append-only. (run_id, seq) is unique: a retried activity cannot write an event twice.

    `hash` chains the row to its predecessor in its subject's trail (`prev_hash`; store/chain.py). Two rows may
    not name the same predecessor: a trail never forks, even when two writers race.
    """

    __tablename__ = "audit_events"
    __table_args__ = (
        UniqueConstraint("run_id", "seq", name="uq_audit_run_seq"),
        UniqueConstraint("ticket_id", "prev_hash", name="uq_audit_chain"),
    )

    id: int | None = Field(default=None, primary_key=True)
    workflow_id: str
    run_id: str
    seq: int
    ticket_id: str = Field(index=True)
    kind: str
    actor: str = Field(index=True)
    at: datetime = Field(index=True)
    status: str
    summary: str
    detail: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    prev_hash: str | None = Field(default=None, description="the hash of the trail's previous event")
    hash: str | None = Field(default=None, description="sha256 over prev_hash and this event's fields")


class DecisionRow(SQLModel, table=True):
    __tablename__ = "decisions"

    request_id: str = Field(primary_key=True)
    ticket_id: str = Field(index=True)
    kind: str
    question: str
    options: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    deciders: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    requested_at: datetime
    option: str | None = None
    decided_by: str | None = None
    channel: str | None = None
    note: str = ""
    decided_at: datetime | None = None


class VerdictRow(SQLModel, table=True):
    """A gate verdict with its raw samples, so it can be re-derived without rerunning anything."""

    __tablename__ = "verdicts"
    __table_args__ = (UniqueConstraint("run_id", "seq", "gate", name="uq_verdict_event_gate"),)

    id: int | None = Field(default=None, primary_key=True)
    workflow_id: str
    run_id: str
    seq: int
    ticket_id: str = Field(index=True)
    attempt: int
    gate: str
    metric: str
    verdict: str
    rule: str
    reason: str
    method: str
    median: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    cv: float | None = None
    confidence: float
    samples: list[float] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    baseline_samples: list[float] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    host: str
    commit: str
    recorded_at: datetime
