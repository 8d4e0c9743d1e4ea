"""SQLModel tables. The audit trail and its projections are written only through `daedalus.store.records.apply`,
one audit event at a time; API tokens only through `daedalus.store.tokens`."""

from datetime import datetime
from typing import Any

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
    seal: str | None = Field(
        default=None,
        description="an HMAC under the audit key over `hash` and what the event decided (seals.py)",
    )


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
    unit: str = ""
    rounds_needed: int | None = None
    standard_error: float | None = None
    error_dof: int | None = None
    # What `daedalus verdict rederive` needs: the gate as judged, the measurement, and what was measured.
    gate_spec: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    measurement: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    provenance: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    evidence: dict[str, str] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}")
    )
    lease: dict[str, Any] | None = Field(
        default=None, sa_column=Column(JSON, nullable=True), description="the GPU lease it ran under"
    )


class LessonRow(SQLModel, table=True):
    """What the team learned, attached to an engine or a host; read into later specs and agent prompts.

    (subject_kind, subject, text) is unique: the same lesson recorded twice is kept once.
    """

    __tablename__ = "lessons"
    __table_args__ = (UniqueConstraint("subject_kind", "subject", "text", name="uq_lesson_subject_text"),)

    id: int | None = Field(default=None, primary_key=True)
    subject_kind: str = Field(index=True, description="engine | host")
    subject: str = Field(index=True)
    kind: str = Field(description="outcome | trap | decision_note")
    text: str
    source: str = Field(default="", description="where it came from: a ticket id, a decision request id")
    recorded_by: str = ""
    recorded_at: datetime = Field(index=True)


class CampaignRow(SQLModel, table=True):
    """A sweep of presets x workloads on one host, with its provenance and the preset it proposes."""

    __tablename__ = "campaigns"

    campaign_id: str = Field(primary_key=True)
    title: str
    host: str
    engine: str
    model: str
    status: str = Field(index=True)
    started_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    proposal: str | None = Field(
        default=None, description="the Pareto-best preset that passed the constraints"
    )
    proposal_reason: str = ""
    spec: dict[str, object] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    provenance: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class CampaignCellRow(SQLModel, table=True):
    """One measured cell of a campaign matrix; a crashed cell is a finding, kept with its evidence."""

    __tablename__ = "campaign_cells"
    __table_args__ = (UniqueConstraint("campaign_id", "cell", name="uq_campaign_cell"),)

    id: int | None = Field(default=None, primary_key=True)
    campaign_id: str = Field(index=True)
    cell: str = Field(description="the cell's key, e.g. kv=q8_0/context=1024/users=2")
    preset: str
    label: str
    axes: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    outcome: str = Field(description="measured | crashed | invalid")
    decode_tps: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    cv: float | None = None
    samples: list[float] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    method: str = ""
    kib_per_token: float | None = None
    needle_found: int | None = None
    needle_total: int | None = None
    needle_lower: float | None = None
    garbage: str = Field(default="", description="what the garbage detectors named; empty when clean")
    ppl_delta_pct: float | None = None
    feasible: bool = False
    detail: str = ""
    evidence: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    measured_at: datetime


class ApiTokenRow(SQLModel, table=True):
    """An API bearer token, stored as a salted hash (store/tokens.py); the token itself is shown once, at
    `daedalus token create`, and kept nowhere. Written by the token commands, not by audit events."""

    __tablename__ = "api_tokens"

    token_id: str = Field(primary_key=True, description="the token's public part, dtk_<token_id>_<secret>")
    person: str = Field(index=True)
    salt: str = Field(description="16 random bytes, hex")
    digest: str = Field(description="sha256(salt + secret), hex")
    created_at: datetime
    created_by: str = Field(description="who ran `daedalus token create` (the local user)")
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
