"""Acquire, hold and release GPU leases from anywhere (an activity, a workflow's client, the CLI, a bench).

    async with holding(client, "mavis", LeaseRequest(lease_id=..., holder="ticket 4 gate decode", gpus=[0, 1])) as lease:
        ...  # the GPUs are ours; heartbeats run in the background

A lease that is revoked (a tenant's preemption) or expires while held cancels the body, which then raises
`LeaseLost` with the keeper's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import (
    Client,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from daedalus.errors import LeaseError, LeaseLost, LeaseRefused
from daedalus.hosts.leases import (
    HostConfig,
    KeeperInput,
    KeeperState,
    LeaseOutcome,
    LeaseRequest,
    LeaseStatus,
    Release,
    TenantDemand,
    keeper_id,
    waiting_ttl_s,
)
from daedalus.hosts.registry import Registry

KEEPER_WORKFLOW = "LeaseKeeperWorkflow"
"""The keeper's workflow type. It is called by name (and its handlers below by theirs), with typed arguments and
results: this module serves activities and the CLI, below the workflows in the layers, so it never imports the
workflow; tests/hosts/test_keeper_names.py holds each name to LeaseKeeperWorkflow's definition."""
CONFIGURE, ACQUIRE, RELEASE, TENANT_DEMAND = "configure", "acquire", "release", "tenant_demand"
"""The keeper's updates."""
LEASE, STATE = "lease", "state"
"""The keeper's queries."""
KEEPALIVE, TICKET_PASSED = "keepalive", "ticket_passed"
"""The keeper's signals."""
RECORD_HOST_CHECK = "record_host_check"
"""The keeper's update that keeps a host's check of itself (daedalus.hosts.check)."""


async def ensure_keeper(
    client: Client, registry: Registry, host: str, *, control_queue: str, **options: Any
) -> WorkflowHandle[Any, Any]:
    """Start the host's keeper if it is not running, and give it the registry's current entry."""
    spec = registry.host(host)
    handle: WorkflowHandle[Any, Any] = await client.start_workflow(
        KEEPER_WORKFLOW,
        KeeperInput(host=spec, pool_constraints=registry.constraints, **options),
        id=keeper_id(host),
        task_queue=control_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
    running_on = (await handle.describe()).task_queue
    if running_on != control_queue:
        # Another deployment's keeper (or one left by a control queue that is gone): never hang on it.
        raise LeaseError(
            f"the lease keeper of host {host} ({keeper_id(host)}) runs on task queue {running_on}, not "
            f"{control_queue}; terminate it (`temporal workflow terminate -w {keeper_id(host)}`) or use that queue"
        )
    await _update(
        client,
        host,
        CONFIGURE,
        HostConfig(host=spec, pool_constraints=registry.constraints),
        KeeperState,
    )
    return handle


async def ensure_keepers(client: Client, registry: Registry, *, control_queue: str) -> None:
    for host in registry.names:
        await ensure_keeper(client, registry, host, control_queue=control_queue)


BUSY_RETRY_S = 60.0
"""How long to keep retrying while the keeper has too many updates in flight (Temporal's per-workflow limit)."""


async def _update(client: Client, host: str, update: str, argument: Any, result_type: Any) -> Any:
    handle = client.get_workflow_handle(keeper_id(host))
    deadline = time.monotonic() + BUSY_RETRY_S
    delay = 0.02
    try:
        while True:
            try:
                return await handle.execute_update(update, argument, result_type=result_type)
            except WorkflowUpdateRPCTimeoutOrCancelledError:
                # A busy keeper took longer than the RPC allows; every update here is safe to send again.
                if time.monotonic() > deadline:
                    raise LeaseError(
                        f"the lease keeper of host {host} did not answer within {BUSY_RETRY_S:g}s"
                    ) from None
            except RPCError as error:
                if error.status is not RPCStatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.5)
    except WorkflowUpdateFailedError as error:
        cause = error.cause
        message = cause.message if isinstance(cause, ApplicationError) else str(cause or error)
        raise LeaseRefused(message) from error
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise LeaseError(
                f"no lease keeper runs for host {host} (workflow {keeper_id(host)}); the control worker starts "
                f"one per host in hosts.yaml (`daedalus up` or `daedalus worker --control`)"
            ) from error
        raise LeaseError(f"lease keeper of host {host}: {error.message}") from error


async def _query_lease(client: Client, host: str, lease_id: str) -> LeaseOutcome:
    try:
        outcome: LeaseOutcome = await client.get_workflow_handle(keeper_id(host)).query(
            LEASE, lease_id, result_type=LeaseOutcome
        )
    except RPCError as error:
        raise LeaseError(f"lease keeper of host {host}: {error.message}") from error
    return outcome


async def keepalive(client: Client, host: str, lease_id: str) -> None:
    try:
        await client.get_workflow_handle(keeper_id(host)).signal(KEEPALIVE, lease_id)
    except RPCError as error:
        raise LeaseError(f"lease keeper of host {host}: {error.message}") from error


async def acquire(client: Client, host: str, request: LeaseRequest) -> LeaseOutcome:
    """Wait until the lease is granted; raises LeaseRefused with the keeper's reason when it is not.

    The `acquire` update queues the request and waits inside the keeper (answering at once on the grant); the
    next two in line keep calling it, the rest of the queue follows its place with the `lease` query and keeps
    the request alive with the `keepalive` signal, so that a long queue never exhausts Temporal's limit of
    in-flight updates per workflow.
    """
    outcome: LeaseOutcome = await _update(client, host, ACQUIRE, request, LeaseOutcome)
    kept_alive = time.monotonic()
    every = waiting_ttl_s(request) / 4
    while True:
        if outcome.status is LeaseStatus.GRANTED:
            return outcome
        if outcome.status is not LeaseStatus.WAITING:
            raise LeaseRefused(f"lease {request.lease_id} on host {host} not granted: {outcome.reason}")
        position = outcome.position or 0
        try:
            if position < 2:
                asked = time.monotonic()
                outcome = await _update(client, host, ACQUIRE, request, LeaseOutcome)
                kept_alive = asked
                if time.monotonic() - asked < 0.5:
                    await asyncio.sleep(0.1)  # the keeper had no room to wait: do not spin
                continue
            await asyncio.sleep(min(2.0, 0.25 * position))
            if time.monotonic() - kept_alive > every:
                await keepalive(client, host, request.lease_id)
                kept_alive = time.monotonic()
            outcome = await _query_lease(client, host, request.lease_id)
        except LeaseRefused:
            raise
        except LeaseError:
            # A keeper slow to answer (a loaded worker) is not a refusal: the request stays queued until its
            # waiting ttl, and the next look may get through.
            if time.monotonic() - kept_alive > waiting_ttl_s(request):
                raise


async def heartbeat(client: Client, host: str, lease_id: str) -> LeaseOutcome:
    """Keep a held lease alive and read where it stands (revoked, expired...)."""
    await keepalive(client, host, lease_id)
    return await _query_lease(client, host, lease_id)


async def release(client: Client, host: str, lease_id: str, reason: str = "released") -> None:
    await _update(client, host, RELEASE, Release(lease_id=lease_id, reason=reason), LeaseOutcome)


async def tenant_demand(client: Client, host: str, tenant: str, *, busy: bool) -> list[str]:
    """The tenant's own work arrived (busy) or ended: returns the lease ids revoked for it."""
    revoked: list[str] = await _update(
        client, host, TENANT_DEMAND, TenantDemand(tenant=tenant, busy=busy), list[str]
    )
    return revoked


async def keeper_state(client: Client, host: str) -> KeeperState:
    state: KeeperState = await client.get_workflow_handle(keeper_id(host)).query(
        STATE, result_type=KeeperState
    )
    return state


async def ticket_passed(client: Client, registry: Registry, ticket_id: str) -> None:
    """Lift at once every standing constraint bound to `ticket_id` (the keepers also poll the store)."""
    for host in registry.names:
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(keeper_id(host)).signal(TICKET_PASSED, ticket_id)


@dataclass
class HeldLease:
    host: str
    outcome: LeaseOutcome
    lost: str | None = None
    heartbeats: int = 0
    _owner: asyncio.Task[Any] | None = field(default=None, repr=False)

    @property
    def gpus(self) -> list[int]:
        return self.outcome.gpus


async def _renew(client: Client, host: str, lease_id: str, *, deadline: float) -> tuple[LeaseOutcome, float]:
    """Keepalive and status, retried until `deadline` (monotonic); returns the answer and when it was sent."""
    problem = "no answer"
    while (left := deadline - time.monotonic()) > 0:
        sent = time.monotonic()
        try:
            return await asyncio.wait_for(heartbeat(client, host, lease_id), timeout=left), sent
        except (LeaseError, TimeoutError) as error:
            problem = str(error) or "no answer"
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    reason = f"could not renew it in time ({problem}); stopped so that no one else's run shares its GPUs"
    return LeaseOutcome(lease_id=lease_id, status=LeaseStatus.UNKNOWN, host=host, reason=reason), deadline


@contextlib.asynccontextmanager
async def holding(
    client: Client, host: str, request: LeaseRequest, *, heartbeat_s: float | None = None
) -> AsyncIterator[HeldLease]:
    """Hold the lease for the body; heartbeats every ttl/3; released on exit, whatever happens."""
    outcome = await acquire(client, host, request)
    held = HeldLease(host=host, outcome=outcome, _owner=asyncio.current_task())
    interval = heartbeat_s or request.ttl_s / 3

    async def beat() -> None:
        # Self-fencing: the keeper expires the lease `ttl` after the last keepalive it saw. If a keepalive cannot
        # be confirmed within 80% of that (from when it was sent), stop: better lose this run than let two
        # holders share a GPU.
        confirmed = time.monotonic()
        fence = request.ttl_s * 0.8
        while True:
            await asyncio.sleep(interval)
            answer, sent = await _renew(client, host, request.lease_id, deadline=confirmed + fence)
            held.heartbeats += 1
            if answer.status is LeaseStatus.GRANTED:
                confirmed = sent
                continue
            held.lost = (
                f"lease {request.lease_id} on host {host} lost ({answer.status.value}): {answer.reason}"
            )
            if held._owner is not None:
                held._owner.cancel()
            return

    beater = asyncio.create_task(beat())
    try:
        yield held
    except asyncio.CancelledError:
        if held.lost is not None:
            raise LeaseLost(held.lost) from None
        raise
    finally:
        beater.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beater
        with contextlib.suppress(LeaseError, RPCError):
            await asyncio.shield(release(client, host, request.lease_id))
