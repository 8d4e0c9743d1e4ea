"""A lease keeper on the session's dev server: its control worker and the host worker that runs tenants."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from temporalio.client import Client
from temporalio.worker import Worker

from daedalus.activities.hosts import KeeperStoreActivities, TenantActivities
from daedalus.hosts import holder
from daedalus.hosts.registry import Constraint, GpuSpec, HostSpec, Registry, TenantSpec
from daedalus.workflows.lease_keeper import LeaseKeeperWorkflow


@dataclass
class Keeper:
    client: Client
    registry: Registry
    host: str
    control_queue: str
    gpu_state: Path


def host_spec(name: str, gpus: int = 4, tenants: list[TenantSpec] | None = None, **extra: Any) -> HostSpec:
    return HostSpec(
        name=name,
        gpus=GpuSpec(count=gpus, model="simulated", memory_gib=8, simulated=True),
        tenants=tenants or [],
        **extra,
    )


@asynccontextmanager
async def running_keeper(
    client: Client,
    tmp_path: Path,
    *,
    gpus: int = 4,
    tenants: list[TenantSpec] | None = None,
    constraints: list[Constraint] | None = None,
    engine: Engine | None = None,
    host_worker: bool = True,
    workflows: list[type] | None = None,
    control_activities: list[Any] | None = None,
    host_activities: list[Any] | None = None,
    **keeper_options: Any,
) -> AsyncIterator[Keeper]:
    name = f"h{uuid.uuid4().hex[:10]}"
    spec = host_spec(name, gpus, tenants)
    registry = Registry(hosts=[spec], constraints=constraints or [])
    control_queue = f"test-{uuid.uuid4()}"
    gpu_state = tmp_path / "gpus"
    activities: list[Any] = list(control_activities or [])
    if engine is not None:
        activities.append(KeeperStoreActivities(engine).passed_tickets)
    control = Worker(
        client,
        task_queue=control_queue,
        workflows=[LeaseKeeperWorkflow, *(workflows or [])],
        activities=activities,
        workflow_failure_exception_types=[Exception],
        max_concurrent_activities=4,
    )
    tenant = TenantActivities(gpu_state)
    workers = [control]
    if host_worker:
        workers.append(
            Worker(
                client,
                task_queue=spec.task_queue,
                activities=[tenant.pause_tenant, tenant.resume_tenant, *(host_activities or [])],
            )
        )
    async with contextlib_multi(workers):
        await holder.ensure_keeper(client, registry, name, control_queue=control_queue, **keeper_options)
        yield Keeper(
            client=client, registry=registry, host=name, control_queue=control_queue, gpu_state=gpu_state
        )
        handle = client.get_workflow_handle(f"lease-keeper-{name}")
        await handle.terminate("test over")


@asynccontextmanager
async def contextlib_multi(workers: list[Worker]) -> AsyncIterator[None]:
    from contextlib import AsyncExitStack

    async with AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield


async def until_queued(client: Client, host: str, lease_id: str, timeout_s: float = 30) -> None:
    """Wait until the keeper holds `lease_id` in its queue: the order of arrival is the keeper's, not a sleep's."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = await holder.keeper_state(client, host)
        if any(w.request.lease_id == lease_id for w in state.waiting):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{lease_id} never reached the keeper of {host}'s queue: {state.waiting}")
        await asyncio.sleep(0.05)
