"""Inputs and outputs of the ticket's host-side steps: attempt, build, gate."""

from pydantic import Field

from daedalus.schemas._base import Model
from daedalus.schemas.gates import GateSpec, LeaseRecord
from daedalus.schemas.ticket import EngineRef, TicketSpec


class ResourceLimits(Model):
    """What one confined step (an agent's command, a build, a gate) may use; a host's registry entry may set
    its own (`limits:` in hosts.yaml), else these defaults hold. See daedalus.confinement."""

    processes: int = Field(default=1024, ge=8, le=1_000_000, description="live processes and threads at once")
    memory_mib: int | None = Field(
        default=None, ge=64, description="memory of all its processes together; None = memory_fraction"
    )
    memory_fraction: float = Field(
        default=0.75, gt=0, le=1, description="without memory_mib: this share of the host's memory"
    )
    tmp_mib: int = Field(default=2048, ge=1, description="its /tmp (a tmpfs, in memory)")
    file_mib: int = Field(default=16384, ge=1, description="the largest file it may write")


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
    engine: EngineRef | None = Field(
        default=None, description="for a ticket without an agent: the engine to build at this commit"
    )
    host: str = Field(default="", description="the host it runs on (named in a checkout's errors)")


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
    startup_s: int = Field(
        default=0,
        ge=0,
        description="engine start-up time the step may spend beyond the gate's timeout_s (the workflow gave the "
        "activity that much more); 0: the command's whole run counts against timeout_s, as before",
    )
