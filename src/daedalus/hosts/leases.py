"""GPU leases: the requests, the leases, the keeper's state, and the pure rule that decides who gets which GPUs.

Everything here is deterministic and free of I/O: `LeaseKeeperWorkflow` calls `plan` on every change.

The rule (no starvation, FIFO within a priority):
* waiting requests are ranked by effective priority (priority + one step per `aging_s` waited), then by
  arrival order;
* walking the ranking, a request is granted when every GPU it needs is free (not leased, not reserved, and
  not held by a tenant that is still running); otherwise the GPUs it needs are *reserved*, so that no request
  ranked after it can take them first. A stream of small or high-priority requests therefore cannot starve a
  waiting one forever: aging raises it to the top, and from the top its GPUs are held for it;
* a tenant on needed GPUs is asked to pause (see `TenantState`); the GPUs are reserved until it has.

Tenant preemption (documented rule): a tenant of priority P holds its GPUs while it runs. A lease request
with priority > P may pause it at any time; one with priority <= P only while the tenant is idle. When the
tenant's own work arrives (`tenant_demand busy=True`), every lease on its GPUs with priority < P is revoked:
the holder learns it at its next heartbeat and must stop (a revoked measurement is INVALID, never a FAIL);
the tenant is resumed once those leases are released or have expired.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from daedalus.errors import LeaseRefused
from daedalus.hosts.registry import Constraint, HostSpec, TenantSpec
from daedalus.schemas._base import Model
from daedalus.schemas.host_check import HostCheckRecord

KEEPER_PREFIX = "lease-keeper-"
LEASE_REFUSED = LeaseRefused.__name__
"""The ApplicationError type of a lease the keeper would not grant, as a workflow sees it: the acquire activity
raises it, `holding_lease` does not retry it (the message says why)."""


def keeper_id(host: str) -> str:
    """The workflow id of the host's lease keeper (one per host, for its whole life)."""
    return f"{KEEPER_PREFIX}{host}"


WAITING_TTL_FLOOR_S = 60.0


class State(BaseModel):
    """Mutable state carried across continue-as-new (the keeper changes it in place)."""

    model_config = ConfigDict(extra="forbid")


class PresetFacts(Model):
    """What the keeper needs of a preset to check standing constraints: the engine and the preset's fields."""

    engine: str
    name: str
    fields: dict[str, Any] = Field(default_factory=dict)


class LeaseRequest(Model):
    """A step's request for GPUs on a host. `lease_id` is the caller's and makes acquire idempotent."""

    lease_id: str = Field(min_length=1, max_length=200)
    holder: str = Field(min_length=1, description="who, in words: 'ticket 4 gate decode_tps'")
    purpose: str = Field(default="step", description="gate, benchmark, ab, launch, training, ...")
    gpus: list[int] | None = Field(default=None, description="these GPU indices")
    count: int | None = Field(default=None, ge=1, description="or any this many GPUs")
    priority: int = Field(default=50, ge=0, le=100)
    ttl_s: float = Field(
        default=60.0, gt=0, description="the lease expires this long after its last heartbeat"
    )
    preset: PresetFacts | None = None
    wait_timeout_s: float | None = Field(default=None, gt=0, description="give up after waiting this long")

    @model_validator(mode="after")
    def _one_way_to_name_gpus(self) -> LeaseRequest:
        if (self.gpus is None) == (self.count is None):
            raise ValueError("name the GPUs either by `gpus` (indices) or by `count`, exactly one of them")
        if self.gpus is not None and (not self.gpus or len(set(self.gpus)) != len(self.gpus)):
            raise ValueError(f"`gpus` must be distinct indices, got {self.gpus}")
        return self


class WaitingLease(State):
    request: LeaseRequest
    seq: int
    requested_at: datetime
    last_heartbeat: datetime
    pausing_for: list[str] = Field(default_factory=list, description="tenants being paused for it")


class Lease(State):
    lease_id: str
    holder: str
    purpose: str
    gpus: list[int]
    priority: int
    ttl_s: float
    requested_at: datetime
    granted_at: datetime
    last_heartbeat: datetime
    revoked: str | None = None
    confirmed: bool = Field(
        default=False, description="the holder has sent a keepalive since the grant (it knows it holds it)"
    )

    @property
    def live_s(self) -> float:
        """How long after its last heartbeat the lease expires: until its holder has learnt of the grant, as
        long as a queued request lives (a loaded holder may take a while to see it)."""
        return self.ttl_s if self.confirmed else max(self.ttl_s, WAITING_TTL_FLOOR_S)


class LeaseStatus(StrEnum):
    GRANTED = "granted"
    WAITING = "waiting"
    REFUSED = "refused"
    REVOKED = "revoked"
    RELEASED = "released"
    UNKNOWN = "unknown"
    """Not held and not waiting: released, expired, or never asked for."""


class LeaseOutcome(Model):
    """What acquire and heartbeat answer."""

    lease_id: str
    status: LeaseStatus
    host: str
    gpus: list[int] = Field(default_factory=list)
    reason: str = ""
    requested_at: datetime | None = None
    granted_at: datetime | None = None
    position: int | None = Field(default=None, description="place in the ranking while waiting (0 = next)")

    @property
    def wait_ms(self) -> float | None:
        if self.requested_at is None or self.granted_at is None:
            return None
        return (self.granted_at - self.requested_at).total_seconds() * 1000


class TenantMode(StrEnum):
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"


class TenantState(State):
    spec: TenantSpec
    mode: TenantMode = TenantMode.RUNNING
    busy: bool = Field(default=False, description="its own work has arrived (it asked for its GPUs back)")
    since: datetime | None = None
    last_check: str = ""
    pauses: int = 0
    resumes: int = 0


class KeeperEventKind(StrEnum):
    GRANTED = "granted"
    RELEASED = "released"
    EXPIRED = "expired"
    REFUSED = "refused"
    REVOKED = "revoked"
    ABANDONED = "abandoned"
    TENANT_PAUSED = "tenant_paused"
    TENANT_PAUSE_FAILED = "tenant_pause_failed"
    TENANT_RESUMED = "tenant_resumed"
    CONSTRAINT_LIFTED = "constraint_lifted"


class KeeperEvent(Model):
    at: datetime
    kind: KeeperEventKind
    lease_id: str = ""
    gpus: list[int] = Field(default_factory=list)
    detail: str = ""


class KeeperCounters(State):
    granted: int = 0
    released: int = 0
    expired: int = 0
    refused: int = 0
    revoked: int = 0
    tenant_pauses: int = 0
    tenant_resumes: int = 0


class KeeperState(State):
    host: HostSpec
    pool_constraints: list[Constraint] = Field(default_factory=list)
    passed_tickets: list[str] = Field(default_factory=list)
    held: list[Lease] = Field(default_factory=list)
    waiting: list[WaitingLease] = Field(default_factory=list)
    tenants: list[TenantState] = Field(default_factory=list)
    counters: KeeperCounters = Field(default_factory=KeeperCounters)
    events: list[KeeperEvent] = Field(default_factory=list, description="the latest, newest last")
    next_seq: int = 0
    aging_s: float = 300.0
    refusals: list[LeaseOutcome] = Field(
        default_factory=list,
        description="the latest refusals, oldest first, carried across continue-as-new so that a holder asking "
        "after it still hears why (keepers before the `carry-refusals` patch dropped them there)",
    )
    last_check: HostCheckRecord | None = Field(
        default=None, description="the host's last check of itself, sent by its worker at start"
    )

    def live_constraints(self) -> list[Constraint]:
        every = [*self.pool_constraints, *self.host.constraints]
        return [c for c in every if c.until_ticket is None or c.until_ticket not in self.passed_tickets]


class KeeperInput(Model):
    host: HostSpec
    pool_constraints: list[Constraint] = Field(default_factory=list)
    state: KeeperState | None = Field(default=None, description="carried over by continue-as-new")
    max_history: int = Field(default=3000, ge=50, description="continue as new past this many events")
    constraint_poll_s: float = Field(default=60.0, gt=0)
    aging_s: float = Field(default=300.0, gt=0)


class HostConfig(Model):
    """A new registry entry for a running keeper (hosts.yaml changed)."""

    host: HostSpec
    pool_constraints: list[Constraint] = Field(default_factory=list)


class Release(Model):
    lease_id: str
    reason: str = "released"


class TenantDemand(Model):
    tenant: str
    busy: bool


class TenantCheck(Model):
    """A pause (or resume) as it went on the host: whether the GPUs were seen free, and what NVML read."""

    tenant: str
    ok: bool
    used_mib: dict[int, int] = Field(default_factory=dict)
    waited_s: float = 0.0
    detail: str = ""


class TenantCommand(Model):
    host: str
    tenant: TenantSpec
    simulated: bool = Field(default=False, description="the host's GPUs are simulated by the registry")


def constraint_refusal(request: LeaseRequest, constraints: list[Constraint]) -> str | None:
    """Why the request's preset may not launch under the live constraints, or None."""
    if request.preset is None:
        return None
    broken = [
        why
        for c in constraints
        if (why := c.broken_by(request.preset.engine, request.preset.fields)) is not None
    ]
    if not broken:
        return None
    return f"preset {request.preset.name} is refused: " + "; ".join(broken)


def gpu_refusal(request: LeaseRequest, gpu_count: int) -> str | None:
    """Why the request can never be granted on a host with `gpu_count` GPUs, or None."""
    if request.gpus is not None:
        outside = sorted(i for i in request.gpus if not 0 <= i < gpu_count)
        if outside:
            return f"GPU(s) {outside} do not exist; the host has {gpu_count} (indices 0..{gpu_count - 1})"
    elif request.count is not None and request.count > gpu_count:
        return f"{request.count} GPU(s) asked for; the host has {gpu_count}"
    return None


def waiting_ttl_s(request: LeaseRequest) -> float:
    """How long a queued request lives without a keepalive: its ttl, but never under a minute, so that a
    waiter on a busy machine keeps its place; a dead waiter holds its reservation at most that long."""
    return max(request.ttl_s, WAITING_TTL_FLOOR_S)


def effective_priority(waiting: WaitingLease, now: datetime, aging_s: float) -> float:
    waited = (now - waiting.requested_at).total_seconds()
    return waiting.request.priority + max(0.0, waited) // aging_s


def ranked(state: KeeperState, now: datetime) -> list[WaitingLease]:
    return sorted(state.waiting, key=lambda w: (-effective_priority(w, now, state.aging_s), w.seq))


class Plan(Model):
    grants: dict[str, list[int]] = Field(default_factory=dict)
    pause: dict[str, str] = Field(default_factory=dict, description="tenant -> the lease id it is paused for")
    resume: list[str] = Field(default_factory=list)


def _tenant_blocks(tenant: TenantState, priority: int) -> bool:
    """Whether the tenant keeps its GPUs from a request of this priority (the preemption rule)."""
    return tenant.busy and priority <= tenant.spec.priority


def plan(state: KeeperState, now: datetime) -> Plan:
    """Who gets which GPUs now, which tenants to pause, which to resume. Pure; see the module's rule."""
    result = Plan()
    every = set(range(state.host.gpus.count))
    busy = {i for lease in state.held for i in lease.gpus}
    tenant_of = {i: t for t in state.tenants for i in t.spec.gpus}
    occupied = {i for i, t in tenant_of.items() if t.mode is not TenantMode.PAUSED}
    reserved: set[int] = set()
    wants: list[tuple[set[int], int]] = []
    for waiting in ranked(state, now):
        request = waiting.request
        if request.gpus is not None:
            want = set(request.gpus)
        else:
            assert request.count is not None
            # Prefer GPUs free now with no tenant to pause, then any not leased, lowest index first.
            for pool in (every - busy - reserved - occupied, every - busy - reserved, every - reserved):
                if len(pool) >= request.count:
                    want = set(sorted(pool)[: request.count])
                    break
            else:
                want = set()
        wants.append((want, request.priority))
        if not want or want & (busy | reserved):
            reserved |= want
            continue
        tenants = {tenant_of[i].spec.name: tenant_of[i] for i in want if i in tenant_of}
        held_back = [
            t
            for t in tenants.values()
            if t.mode is not TenantMode.PAUSED or _tenant_blocks(t, request.priority)
        ]
        if held_back:
            for tenant in held_back:
                if tenant.mode is TenantMode.RUNNING and not _tenant_blocks(tenant, request.priority):
                    result.pause.setdefault(tenant.spec.name, request.lease_id)
            reserved |= want
            continue
        result.grants[request.lease_id] = sorted(want)
        busy |= want
    for tenant in state.tenants:
        if tenant.mode is not TenantMode.PAUSED:
            continue
        gpus = set(tenant.spec.gpus)
        # Resume once nobody holds its GPUs and nobody who may keep it paused waits for them.
        waited_for = any(want & gpus and not _tenant_blocks(tenant, prio) for want, prio in wants)
        if not gpus & busy and not waited_for:
            result.resume.append(tenant.spec.name)
    return result


class LeasedCommand(Model):
    """One command run on a host under a GPU lease (a gate, a benchmark, an engine launch, a training segment).

    The command sees its GPUs as CUDA_VISIBLE_DEVICES (and DAEDALUS_LEASE_ID / DAEDALUS_LEASE_GPUS)."""

    host: str
    task_queue: str
    request: LeaseRequest
    command: str = Field(min_length=1)
    timeout_s: float = Field(default=3600.0, gt=0)
    wait_s: float = Field(default=3600.0, gt=0, description="how long the step may wait for its lease")
    heartbeat_s: float = Field(default=10.0, gt=0, description="activity heartbeat timeout")
    env: dict[str, str] = Field(default_factory=dict)


class LeasedRun(Model):
    """What a leased command did, and the lease it ran under (a verdict records it)."""

    lease: LeaseOutcome | None = None
    returncode: int | None = None
    timed_out: bool = False
    lost: str | None = Field(default=None, description="why the lease was lost mid-run (revoked, expired)")
    refused: str | None = Field(default=None, description="why the lease was not granted")
    acquire_started: datetime
    granted_seen: datetime | None = None
    released_at: datetime | None = None
    log_tail: str = ""


def _without_legacy(data: Any, legacy: dict[str, Any]) -> Any:
    """Drop the fields the one `LeaseCall` both calls once shared (at their old defaults): an activity scheduled
    by a worker from before the split still runs on one after it."""
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if k not in legacy or v != legacy[k]}
    return data


class LeaseAcquire(Model):
    """A workflow's acquire through the control-queue activity ACQUIRE_LEASE (`workflows.lease_helpers`)."""

    host: str = Field(min_length=1)
    request: LeaseRequest

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        return _without_legacy(data, {"lease_id": "", "reason": "released"})


class LeaseRelease(Model):
    """A workflow's release through the control-queue activity RELEASE_LEASE (`workflows.lease_helpers`)."""

    host: str = Field(min_length=1)
    lease_id: str = Field(min_length=1)
    reason: str = "released"

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        return _without_legacy(data, {"request": None})
