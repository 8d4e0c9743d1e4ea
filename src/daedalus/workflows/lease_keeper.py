"""LeaseKeeperWorkflow (`lease-keeper-<host>`): the one place that decides who uses a host's GPUs.

Holders call the updates `acquire` (bounded wait: it answers WAITING after `ACQUIRE_WAIT_S`, and the caller
asks again with the same lease id, keeping its place), `heartbeat` and `release`; a lease whose holder stops
heartbeating expires after its `ttl_s`. The rule that ranks requests and pauses tenants is the pure
`daedalus.hosts.leases.plan`. Tenants are paused and resumed by activities on the host's own queue; the
standing constraints bound to tickets are lifted when the store says the ticket passed (polled through a
control-queue activity, or at once by the `ticket_passed` signal). State is one model, carried across
continue-as-new.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import PASSED_TICKETS, PAUSE_TENANT, RESUME_TENANT
    from daedalus.errors import BrokenInvariant
    from daedalus.hosts.leases import (
        HostConfig,
        KeeperEvent,
        KeeperEventKind,
        KeeperInput,
        KeeperState,
        Lease,
        LeaseOutcome,
        LeaseRequest,
        LeaseStatus,
        Release,
        TenantCheck,
        TenantCommand,
        TenantDemand,
        TenantMode,
        TenantState,
        WaitingLease,
        constraint_refusal,
        gpu_refusal,
        plan,
        ranked,
        waiting_ttl_s,
    )
    from daedalus.schemas.host_check import HostCheck, HostCheckReceipt, HostCheckRecord

ACQUIRE_WAIT_S = 20.0
"""How long one `acquire` call waits before answering WAITING: bounded so that continue-as-new never waits
on a parked handler for long."""
MAX_PARKED = 4
"""Acquire calls allowed to wait inside the workflow at once; the others answer WAITING at once and the caller
asks again. Temporal refuses more than 10 in-flight updates per workflow (history.maxInFlightUpdates), and
heartbeats and releases need room too."""
UNCONFIRMED_GRANT_GRACE = "unconfirmed-grant-grace"
"""Patch: a grant lives at least a minute until its holder's first keepalive (`Lease.live_s`), then its ttl.
Keepers recorded before it (tests/hosts/histories/lease-keeper-{68922a1,551e656,381dc57}.json) expire every
lease after its ttl; the change shipped unguarded in 6ad1f4b, which is why those histories failed replay."""
CARRY_REFUSALS = "carry-refusals"
"""Patch: the refusals (why a lease was not granted) go into the state carried across continue-as-new, so a
holder that asks after it hears REFUSED with the reason, not UNKNOWN. Keepers before it dropped them there
(tests/hosts/histories: every lease-keeper-<commit>.json recorded before it replays without the marker;
lease-keeper-refusals-<commit>.json was recorded with it)."""
KEPT_EVENTS = 200
KEPT_REFUSALS = 200


@workflow.defn
class LeaseKeeperWorkflow:
    @workflow.init
    def __init__(self, input: KeeperInput) -> None:
        self._input = input
        self._state = input.state or KeeperState(
            host=input.host,
            pool_constraints=input.pool_constraints,
            tenants=[TenantState(spec=t) for t in input.host.tenants],
            aging_s=input.aging_s,
        )
        self._refusals: dict[str, LeaseOutcome] = {r.lease_id: r for r in self._state.refusals}
        """Refusals by lease id, kept here; the state holds them only on its way across continue-as-new."""
        self._state.refusals = []
        self._changed = True
        self._draining = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_poll: datetime | None = None
        self._polling = False
        self._parked = 0
        self._grant_grace = True
        """Whether grants wait for their first keepalive (UNCONFIRMED_GRANT_GRACE), decided when `run` starts."""

    @workflow.run
    async def run(self, input: KeeperInput) -> None:
        self._grant_grace = workflow.patched(UNCONFIRMED_GRANT_GRACE)  # first thing: nothing awaited yet
        while True:
            deadline = self._next_deadline(workflow.now())
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self._changed, timeout=deadline)
            self._changed = False
            self._step(workflow.now())
            self._show()
            info = workflow.info()
            if info.get_current_history_length() > input.max_history or info.is_continue_as_new_suggested():
                self._draining = True
                await workflow.wait_condition(lambda: not self._tasks and workflow.all_handlers_finished())
                workflow.continue_as_new(input.model_copy(update={"state": self._carried()}))

    def _carried(self) -> KeeperState:
        """The state the next run starts from: with the refusals since CARRY_REFUSALS, as it was before."""
        refusals = list(self._refusals.values()) if workflow.patched(CARRY_REFUSALS) else []
        return self._state.model_copy(update={"refusals": refusals})

    # -- queries, updates, signals ---------------------------------------------------------------------------

    @workflow.query
    def state(self) -> KeeperState:
        return self._state.model_copy(update={"refusals": list(self._refusals.values())})

    @workflow.update
    async def acquire(self, request: LeaseRequest) -> LeaseOutcome:
        """Queue the request (or find it again) and wait a little for the grant; the caller then follows it
        with the `lease` query and keeps it alive with the `keepalive` signal (neither counts against
        Temporal's limit of in-flight updates)."""
        now = workflow.now()
        lease_id = request.lease_id
        if self._held(lease_id) is None:
            self._refusals.pop(lease_id, None)  # asking again after a refusal is a new request
            waiting = self._waiting(lease_id)
            if waiting is None:
                self._state.waiting.append(
                    WaitingLease(
                        request=request, seq=self._state.next_seq, requested_at=now, last_heartbeat=now
                    )
                )
                self._state.next_seq += 1
                self._changed = True
            else:
                waiting.last_heartbeat = now
            if not self._draining and self._parked < MAX_PARKED:
                wait_s = min(ACQUIRE_WAIT_S, request.ttl_s / 2)
                self._parked += 1
                try:
                    await workflow.wait_condition(
                        lambda: self._waiting(lease_id) is None or self._draining, timeout=wait_s
                    )
                except TimeoutError:
                    pass
                finally:
                    self._parked -= 1
        return self._outcome(lease_id)

    @workflow.query
    def lease(self, lease_id: str) -> LeaseOutcome:
        """Where a lease stands: granted (with its GPUs), waiting (with its place), refused, revoked or gone."""
        return self._outcome(lease_id)

    @workflow.signal
    def keepalive(self, lease_id: str) -> None:
        """The holder (or the waiter) is alive. A signal, not an update: many holders never exhaust the keeper."""
        held = self._held(lease_id)
        if held is not None:
            held.confirmed = True
        item = held or self._waiting(lease_id)
        if item is not None:
            item.last_heartbeat = workflow.now()
            self._changed = True

    @acquire.validator
    def _validate_acquire(self, request: LeaseRequest) -> None:
        if self._held(request.lease_id) is not None or self._waiting(request.lease_id) is not None:
            return  # asking again for the same lease
        reason = gpu_refusal(request, self._state.host.gpus.count) or constraint_refusal(
            request, self._state.live_constraints()
        )
        if reason is not None:
            raise ValueError(f"host {self._state.host.name}: {reason}")

    @workflow.update
    def release(self, release: Release) -> LeaseOutcome:
        now = workflow.now()
        lease = self._held(release.lease_id)
        if lease is not None:
            self._state.held.remove(lease)
            self._state.counters.released += 1
            self._event(now, KeeperEventKind.RELEASED, lease.lease_id, lease.gpus, release.reason)
        waiting = self._waiting(release.lease_id)
        if waiting is not None:
            self._state.waiting.remove(waiting)
            self._event(now, KeeperEventKind.ABANDONED, release.lease_id, detail=release.reason)
        self._refusals.pop(release.lease_id, None)
        self._changed = True
        return LeaseOutcome(lease_id=release.lease_id, status=LeaseStatus.RELEASED, host=self._host)

    @workflow.update
    def tenant_demand(self, demand: TenantDemand) -> list[str]:
        """The tenant's own work arrived (busy) or ended; returns the lease ids revoked for it."""
        now = workflow.now()
        tenant = self._tenant(demand.tenant)
        tenant.busy = demand.busy
        revoked: list[str] = []
        if demand.busy:
            for lease in self._state.held:
                if (
                    lease.revoked is None
                    and set(lease.gpus) & set(tenant.spec.gpus)
                    and lease.priority < tenant.spec.priority
                ):
                    lease.revoked = (
                        f"preempted by tenant {tenant.spec.name} (priority {tenant.spec.priority} > "
                        f"{lease.priority}): stop and release"
                    )
                    self._state.counters.revoked += 1
                    self._event(now, KeeperEventKind.REVOKED, lease.lease_id, lease.gpus, lease.revoked)
                    revoked.append(lease.lease_id)
        self._changed = True
        return revoked

    @tenant_demand.validator
    def _validate_demand(self, demand: TenantDemand) -> None:
        self._tenant(demand.tenant)

    @workflow.update
    def configure(self, config: HostConfig) -> KeeperState:
        """hosts.yaml changed: take the new entry; tenants keep their state by name."""
        old = {t.spec.name: t for t in self._state.tenants}
        self._state.host = config.host
        self._state.pool_constraints = config.pool_constraints
        self._state.tenants = [
            old[t.name].model_copy(update={"spec": t}) if t.name in old else TenantState(spec=t)
            for t in config.host.tenants
        ]
        self._changed = True
        return self._state

    @configure.validator
    def _validate_configure(self, config: HostConfig) -> None:
        if config.host.name != self._host:
            raise ValueError(f"this keeper serves host {self._host}, not {config.host.name}")

    @workflow.update
    def record_host_check(self, check: HostCheck) -> HostCheckReceipt:
        """A worker's check of this host, sent before it polls (daedalus.hosts.check). The answer is this
        workflow's clock, which the host compares with its own (clock skew)."""
        now = workflow.now()
        self._state.last_check = HostCheckRecord(check=check, received_at=now)
        return HostCheckReceipt(received_at=now)

    @record_host_check.validator
    def _validate_host_check(self, check: HostCheck) -> None:
        if check.host != self._host:
            raise ValueError(f"this keeper serves host {self._host}, not {check.host}")

    @workflow.signal
    def ticket_passed(self, ticket_id: str) -> None:
        self._lift([ticket_id], workflow.now())

    # -- the keeper's step ------------------------------------------------------------------------------------

    @property
    def _host(self) -> str:
        return self._state.host.name

    def _show(self) -> None:
        """The keeper's state in words, as the Temporal UI shows a workflow's current details."""
        held = "; ".join(f"{h.lease_id} on GPUs {h.gpus} ({h.holder})" for h in self._state.held) or "none"
        tenants = ", ".join(f"{t.spec.name} {t.mode.value}" for t in self._state.tenants) or "none"
        live = ", ".join(c.id for c in self._state.live_constraints()) or "none"
        workflow.set_current_details(
            f"held: {held}\nwaiting: {len(self._state.waiting)}\ntenants: {tenants}\nconstraints: {live}"
        )

    def _step(self, now: datetime) -> None:
        self._expire(now)
        decided = plan(self._state, now)
        for lease_id, gpus in decided.grants.items():
            self._grant(lease_id, gpus, now)
        for name, lease_id in decided.pause.items():
            tenant = self._tenant(name)
            tenant.mode, tenant.since = TenantMode.PAUSING, now
            self._spawn(self._pause(tenant, lease_id))
        for name in decided.resume:
            tenant = self._tenant(name)
            tenant.mode, tenant.since = TenantMode.RESUMING, now
            self._spawn(self._resume(tenant))
        if (
            self._bound_constraints()
            and not self._polling
            and (self._next_poll is None or now >= self._next_poll)
        ):
            self._polling = True
            self._spawn(self._poll_passed())

    def _grant(self, lease_id: str, gpus: list[int], now: datetime) -> None:
        waiting = self._waiting(lease_id)
        if waiting is None:
            raise BrokenInvariant(f"lease {lease_id} granted while not waiting")
        self._state.waiting.remove(waiting)
        request = waiting.request
        self._state.held.append(
            Lease(
                lease_id=lease_id,
                holder=request.holder,
                purpose=request.purpose,
                gpus=gpus,
                priority=request.priority,
                ttl_s=request.ttl_s,
                requested_at=waiting.requested_at,
                granted_at=now,
                last_heartbeat=now,
            )
        )
        self._state.counters.granted += 1
        self._event(now, KeeperEventKind.GRANTED, lease_id, gpus, request.holder)

    def _expire(self, now: datetime) -> None:
        for lease in list(self._state.held):
            if now >= lease.last_heartbeat + timedelta(seconds=self._live_s(lease)):
                self._state.held.remove(lease)
                self._state.counters.expired += 1
                self._event(
                    now,
                    KeeperEventKind.EXPIRED,
                    lease.lease_id,
                    lease.gpus,
                    f"{lease.holder}: no heartbeat for {self._live_s(lease):g}s",
                )
        for waiting in list(self._state.waiting):
            request = waiting.request
            if now >= waiting.last_heartbeat + timedelta(seconds=waiting_ttl_s(request)):
                self._state.waiting.remove(waiting)
                self._event(now, KeeperEventKind.ABANDONED, request.lease_id, detail="stopped asking")
            elif request.wait_timeout_s is not None and now >= waiting.requested_at + timedelta(
                seconds=request.wait_timeout_s
            ):
                holders = ", ".join(f"{h.holder} on GPUs {h.gpus}" for h in self._state.held) or "nobody"
                self._refuse(
                    waiting, now, f"not granted within {request.wait_timeout_s:g}s; held by {holders}"
                )

    def _refuse(self, waiting: WaitingLease, now: datetime, reason: str) -> None:
        self._state.waiting.remove(waiting)
        lease_id = waiting.request.lease_id
        self._refusals[lease_id] = LeaseOutcome(
            lease_id=lease_id,
            status=LeaseStatus.REFUSED,
            host=self._host,
            reason=reason,
            requested_at=waiting.requested_at,
        )
        while len(self._refusals) > KEPT_REFUSALS:
            self._refusals.pop(next(iter(self._refusals)))
        self._state.counters.refused += 1
        self._event(now, KeeperEventKind.REFUSED, lease_id, detail=reason)
        self._changed = True

    def _live_s(self, lease: Lease) -> float:
        return lease.live_s if self._grant_grace else lease.ttl_s

    def _next_deadline(self, now: datetime) -> timedelta | None:
        times = [lease.last_heartbeat + timedelta(seconds=self._live_s(lease)) for lease in self._state.held]
        for waiting in self._state.waiting:
            times.append(waiting.last_heartbeat + timedelta(seconds=waiting_ttl_s(waiting.request)))
            if waiting.request.wait_timeout_s is not None:
                times.append(waiting.requested_at + timedelta(seconds=waiting.request.wait_timeout_s))
            # Aging changes the ranking: look again when the next step of effective priority is reached.
            waited = (now - waiting.requested_at).total_seconds()
            steps = int(waited // self._state.aging_s) + 1
            times.append(waiting.requested_at + timedelta(seconds=steps * self._state.aging_s))
        if self._bound_constraints() and self._next_poll is not None:
            times.append(self._next_poll)
        if not times:
            return None
        return max(min(times) - now, timedelta(milliseconds=10))

    # -- tenants and constraints ------------------------------------------------------------------------------

    def _command(self, tenant: TenantState) -> TenantCommand:
        return TenantCommand(host=self._host, tenant=tenant.spec, simulated=self._state.host.gpus.simulated)

    async def _pause(self, tenant: TenantState, lease_id: str) -> None:
        spec = tenant.spec
        budget = spec.free_timeout_s + 2 * spec.command_timeout_s
        try:
            check = await PAUSE_TENANT.execute(
                self._command(tenant),
                task_queue=self._state.host.task_queue,
                schedule_to_close_timeout=timedelta(seconds=budget + 30),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as error:
            cause = error.cause or error
            check = TenantCheck(
                tenant=spec.name,
                ok=False,
                detail=f"the pause did not run on host {self._host} ({cause}); is `daedalus worker --host "
                f"{self._host}` running there?",
            )
        now = workflow.now()
        tenant.last_check = check.detail
        tenant.since = now
        if check.ok:
            tenant.mode = TenantMode.PAUSED
            tenant.pauses += 1
            self._state.counters.tenant_pauses += 1
            self._event(
                now, KeeperEventKind.TENANT_PAUSED, lease_id, spec.gpus, f"{spec.name}: {check.detail}"
            )
        else:
            reason = (
                f"tenant {spec.name} did not free GPUs {spec.gpus} within {spec.free_timeout_s:g}s "
                f"(used MiB {check.used_mib}, bound {spec.free_below_mib}): {check.detail}"
            )
            self._event(now, KeeperEventKind.TENANT_PAUSE_FAILED, lease_id, spec.gpus, reason)
            others = self._state.host.gpus.count - len(spec.gpus)
            for waiting in ranked(self._state, now):
                request = waiting.request
                needs_tenant = (request.gpus is not None and set(request.gpus) & set(spec.gpus)) or (
                    request.count is not None and request.count > others
                )
                if needs_tenant:
                    self._refuse(waiting, now, reason)
            # It may be half-stopped: put it back as it was.
            tenant.mode = TenantMode.RESUMING
            await self._resume(tenant, after_pause=False)
        self._changed = True

    async def _resume(self, tenant: TenantState, *, after_pause: bool = True) -> None:
        """Start the tenant again; `after_pause=False` restores one whose pause failed (not counted)."""
        spec = tenant.spec
        try:
            check = await RESUME_TENANT.execute(
                self._command(tenant),
                task_queue=self._state.host.task_queue,
                schedule_to_close_timeout=timedelta(seconds=spec.command_timeout_s + 30),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except ActivityError as error:
            check = TenantCheck(tenant=spec.name, ok=False, detail=f"resume failed: {error.cause or error}")
        now = workflow.now()
        tenant.mode, tenant.since, tenant.last_check = TenantMode.RUNNING, now, check.detail
        if check.ok and after_pause:
            tenant.resumes += 1
            self._state.counters.tenant_resumes += 1
        self._event(
            now, KeeperEventKind.TENANT_RESUMED, gpus=spec.gpus, detail=f"{spec.name}: {check.detail}"
        )
        self._changed = True

    def _bound_constraints(self) -> list[str]:
        return sorted({c.until_ticket for c in self._state.live_constraints() if c.until_ticket is not None})

    async def _poll_passed(self) -> None:
        try:
            passed = await PASSED_TICKETS.execute(
                self._bound_constraints(),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=2),
            )
        except ActivityError as error:
            workflow.logger.warning("cannot read which tickets passed: %s", error.cause or error)
            passed = []
        now = workflow.now()
        self._lift(passed, now)
        self._next_poll = now + timedelta(seconds=self._input.constraint_poll_s)
        self._polling = False
        self._changed = True

    def _lift(self, tickets: list[str], now: datetime) -> None:
        for ticket_id in tickets:
            if ticket_id in self._state.passed_tickets:
                continue
            lifted = [c for c in self._state.live_constraints() if c.until_ticket == ticket_id]
            self._state.passed_tickets.append(ticket_id)
            for constraint in lifted:
                self._event(
                    now,
                    KeeperEventKind.CONSTRAINT_LIFTED,
                    detail=f"ticket {ticket_id} passed: {constraint.describe()}",
                )
        self._changed = True

    # -- bookkeeping -----------------------------------------------------------------------------------------

    def _spawn(self, coroutine: object) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coroutine)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _held(self, lease_id: str) -> Lease | None:
        return next((lease for lease in self._state.held if lease.lease_id == lease_id), None)

    def _waiting(self, lease_id: str) -> WaitingLease | None:
        return next((w for w in self._state.waiting if w.request.lease_id == lease_id), None)

    def _tenant(self, name: str) -> TenantState:
        for tenant in self._state.tenants:
            if tenant.spec.name == name:
                return tenant
        known = ", ".join(t.spec.name for t in self._state.tenants) or "none"
        raise ValueError(f"host {self._host} has no tenant {name!r}; its tenants: {known}")

    def _outcome(self, lease_id: str) -> LeaseOutcome:
        lease = self._held(lease_id)
        if lease is not None:
            return LeaseOutcome(
                lease_id=lease_id,
                status=LeaseStatus.REVOKED if lease.revoked else LeaseStatus.GRANTED,
                host=self._host,
                gpus=lease.gpus,
                reason=lease.revoked or "",
                requested_at=lease.requested_at,
                granted_at=lease.granted_at,
            )
        waiting = self._waiting(lease_id)
        if waiting is not None:
            order = [w.request.lease_id for w in ranked(self._state, workflow.now())]
            return LeaseOutcome(
                lease_id=lease_id,
                status=LeaseStatus.WAITING,
                host=self._host,
                requested_at=waiting.requested_at,
                position=order.index(lease_id),
                reason=f"waiting for GPUs; tenants being paused: {waiting.pausing_for}"
                if waiting.pausing_for
                else "",
            )
        refusal = self._refusals.get(lease_id)
        if refusal is not None:
            return refusal
        last = next((e for e in reversed(self._state.events) if e.lease_id == lease_id), None)
        why = f"{last.kind.value}: {last.detail}" if last is not None else "never asked for"
        return LeaseOutcome(lease_id=lease_id, status=LeaseStatus.UNKNOWN, host=self._host, reason=why)

    def _event(
        self,
        at: datetime,
        kind: KeeperEventKind,
        lease_id: str = "",
        gpus: list[int] | None = None,
        detail: str = "",
    ) -> None:
        self._state.events.append(
            KeeperEvent(at=at, kind=kind, lease_id=lease_id, gpus=gpus or [], detail=detail)
        )
        del self._state.events[:-KEPT_EVENTS]
