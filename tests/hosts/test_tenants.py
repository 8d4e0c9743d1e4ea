"""Tenants on the real dev server: a simulated render queue (a real child process) paused for a lease, the GPUs
judged free by their used memory, resumed after; a tenant that does not free its GPUs; its own work preempting
a lower-priority lease."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from daedalus.hosts import holder
from daedalus.hosts.gpus import SimulatedGpuMemory
from daedalus.hosts.leases import KeeperState, LeaseRequest, TenantMode
from daedalus.hosts.registry import TenantSpec
from tests.hosts.keeper_support import running_keeper

RENDER_QUEUE = Path(__file__).parents[1] / "fixtures" / "render_queue.py"


def render_queue(tmp_path: Path, *, stubborn: bool = False, **fields: object) -> TenantSpec:
    pidfile = tmp_path / "render-queue.pid"
    flags = " --ignore-term" if stubborn else ""
    start = (
        f"nohup {sys.executable} {RENDER_QUEUE} --gpus 0,1 --mib 6000 --pidfile {pidfile}{flags} "
        f">> {tmp_path / 'render-queue.log'} 2>&1 &"
    )
    # Like ComfyUI's /free, a stubborn tenant's stop returns at once and frees nothing.
    return TenantSpec.model_validate(
        {
            "name": "comfyui",
            "gpus": [0, 1],
            "priority": 60,
            "pause": f"kill -TERM $(cat {pidfile})",
            "resume": f"[ -s {pidfile} ] && kill -0 $(cat {pidfile}) && exit 0; {start} for i in $(seq 100); do [ -s {pidfile} ] && exit 0; sleep 0.05; done; exit 1",
            "free_below_mib": 512,
            "free_timeout_s": 5,
            **fields,
        }
    )


@contextlib.contextmanager
def tenant_started(tmp_path: Path, tenant: TenantSpec, gpu_state: Path) -> Iterator[Path]:
    pidfile = tmp_path / "render-queue.pid"
    env = {**os.environ, "DAEDALUS_GPU_STATE_DIR": str(gpu_state)}
    gpu_state.mkdir(parents=True, exist_ok=True)
    os.spawnle(os.P_WAIT, "/bin/sh", "sh", "-c", tenant.resume, env)
    try:
        yield pidfile
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


async def wait_running(client: Client, host: str) -> KeeperState:
    for _ in range(100):
        state = await holder.keeper_state(client, host)
        if state.tenants[0].mode is TenantMode.RUNNING:
            return state
        await asyncio.sleep(0.1)
    pytest.fail(f"the tenant did not come back: {state.tenants[0]}")


def lease(lease_id: str, gpus: list[int], priority: int = 50) -> LeaseRequest:
    return LeaseRequest(lease_id=lease_id, holder=f"test {lease_id}", gpus=gpus, priority=priority, ttl_s=10)


async def test_a_lease_pauses_the_tenant_waits_for_free_memory_and_resumes_it(
    temporal_client: Client, tmp_path: Path
) -> None:
    tenant = render_queue(tmp_path)
    async with running_keeper(temporal_client, tmp_path, tenants=[tenant]) as keeper:
        memory = SimulatedGpuMemory(keeper.gpu_state)
        with tenant_started(tmp_path, tenant, keeper.gpu_state) as pidfile:
            assert memory.used_mib([0, 1]) == {0: 6000, 1: 6000}
            free = await holder.acquire(temporal_client, keeper.host, lease("elsewhere", [2, 3]))
            assert free.gpus == [2, 3]  # not the tenant's GPUs: nothing paused
            state = await holder.keeper_state(temporal_client, keeper.host)
            assert state.tenants[0].mode is TenantMode.RUNNING and state.counters.tenant_pauses == 0
            async with holder.holding(temporal_client, keeper.host, lease("gate", [1])) as held:
                assert held.gpus == [1]
                assert memory.used_mib([0, 1]) == {0: 0, 1: 0}
                assert not pidfile.exists()
                state = await holder.keeper_state(temporal_client, keeper.host)
                assert state.tenants[0].mode is TenantMode.PAUSED
                assert "GPUs [0, 1] free after" in state.tenants[0].last_check
            state = await wait_running(temporal_client, keeper.host)
            assert pidfile.exists()
            assert state.counters.tenant_pauses == state.counters.tenant_resumes == 1
            assert memory.used_mib([0, 1]) == {0: 6000, 1: 6000}


async def test_a_tenant_that_does_not_free_its_gpus_gets_the_lease_refused_with_why(
    temporal_client: Client, tmp_path: Path
) -> None:
    tenant = render_queue(tmp_path, stubborn=True, free_timeout_s=1.5)
    async with running_keeper(temporal_client, tmp_path, tenants=[tenant]) as keeper:
        with tenant_started(tmp_path, tenant, keeper.gpu_state):
            with pytest.raises(holder.LeaseRefused) as refused:
                await holder.acquire(temporal_client, keeper.host, lease("gate", [0]))
            message = str(refused.value)
            assert "tenant comfyui did not free GPUs [0, 1] within 1.5s" in message
            assert "used MiB {0: 6000, 1: 6000}, bound 512" in message
            state = await wait_running(temporal_client, keeper.host)
            assert state.counters.tenant_pauses == 0 and state.counters.refused == 1


async def test_the_tenants_own_work_preempts_a_lower_priority_lease_not_a_higher_one(
    temporal_client: Client, tmp_path: Path
) -> None:
    tenant = render_queue(tmp_path)
    async with running_keeper(temporal_client, tmp_path, tenants=[tenant]) as keeper:
        with tenant_started(tmp_path, tenant, keeper.gpu_state) as pidfile:
            urgent = await holder.acquire(temporal_client, keeper.host, lease("urgent", [0], priority=80))
            with pytest.raises(holder.LeaseLost, match="preempted by tenant comfyui"):
                async with holder.holding(
                    temporal_client, keeper.host, lease("bench", [1], priority=20), heartbeat_s=0.2
                ):
                    revoked = await holder.tenant_demand(temporal_client, keeper.host, "comfyui", busy=True)
                    assert revoked == ["bench"]
                    await asyncio.sleep(5)
                    pytest.fail("a revoked lease must stop its holder")
            # The priority-80 lease keeps its GPU; the tenant comes back once it is released.
            state = await holder.keeper_state(temporal_client, keeper.host)
            assert [h.lease_id for h in state.held] == [urgent.lease_id]
            assert state.tenants[0].mode is TenantMode.PAUSED
            # While the tenant is busy, a request at or below its priority does not pause it again.
            await holder.release(temporal_client, keeper.host, "urgent")
            await wait_running(temporal_client, keeper.host)
            assert pidfile.exists()
            with pytest.raises(holder.LeaseRefused, match="not granted within 1s"):
                await holder.acquire(
                    temporal_client,
                    keeper.host,
                    lease("low", [0], priority=60).model_copy(update={"wait_timeout_s": 1.0}),
                )
            await holder.tenant_demand(temporal_client, keeper.host, "comfyui", busy=False)
            granted = await holder.acquire(temporal_client, keeper.host, lease("later", [0], priority=60))
            assert granted.gpus == [0]
