"""Inputs and outputs of the ticket's host-side steps: attempt, build, gate."""

from pydantic import Field

from daedalus.schemas._base import Model
from daedalus.schemas.gates import GateSpec, LeaseRecord
from daedalus.schemas.ticket import EngineRef, TicketSpec


class AttemptInput(Model):
    spec: TicketSpec
    attempt: int = Field(ge=1)
    brief: str
    filing: str = Field(
        default="",
        description="the ticket workflow's first run id: a re-filed ticket id starts its attempts afresh",
    )
    lessons: list[str] = Field(
        default_factory=list,
        description="lessons recorded for the ticket's engine and host (the workflow reads them with `lessons_for`)",
    )


class BuildInput(Model):
    ticket_id: str
    attempt: int = Field(ge=1)
    command: str
    timeout_s: int


class BuildResult(Model):
    ok: bool
    returncode: int
    timed_out: bool = False
    log: str
    log_tail: str = ""


class GateInput(Model):
    ticket_id: str
    attempt: int = Field(ge=1)
    round: int = Field(default=1, ge=1)
    gate: GateSpec
    host: str
    commit: str = ""
    engine: EngineRef | None = Field(
        default=None, description="for a ticket without an agent: the engine to measure at its base commit"
    )
    lease: LeaseRecord | None = Field(
        default=None, description="the GPU lease it runs under: its command sees only these GPUs"
    )
