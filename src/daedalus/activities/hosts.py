"""Host-side activities of the lease keeper: pause and resume a tenant; control-side: which tickets passed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import structlog
from sqlalchemy import Engine
from sqlmodel import Session, col, select
from temporalio import activity
from temporalio.exceptions import ApplicationError

from daedalus.activities.refs import (
    ACQUIRE_LEASE,
    PASSED_TICKETS,
    PAUSE_TENANT,
    RELEASE_LEASE,
    RESUME_TENANT,
    RUN_LEASED,
)
from daedalus.hosts import holder
from daedalus.hosts.gpus import GPU_STATE_ENV, GpuMemory, NvmlGpuMemory, SimulatedGpuMemory
from daedalus.hosts.leases import (
    LEASE_REFUSED,
    LeaseAcquire,
    LeasedCommand,
    LeasedRun,
    LeaseOutcome,
    LeaseRelease,
    TenantCheck,
    TenantCommand,
)
from daedalus.processes import kill_group, log_tail, run_logged
from daedalus.schemas.gates import gpu_environment
from daedalus.schemas.ticket import TicketStatus
from daedalus.store.tables import TicketRow

log = structlog.get_logger(__name__)
CHECK_INTERVAL_S = 0.25


class TenantActivities:
    """Runs a tenant's pause/resume commands on its host and judges the GPUs free by their used memory."""

    def __init__(self, gpu_state_dir: Path, nvml: GpuMemory | None = None) -> None:
        self.gpu_state_dir = gpu_state_dir
        self._nvml = nvml

    def _memory(self, command: TenantCommand) -> GpuMemory:
        if command.simulated:
            return SimulatedGpuMemory(self.gpu_state_dir)
        if self._nvml is None:
            self._nvml = NvmlGpuMemory()
        return self._nvml

    async def _shell(self, line: str, timeout_s: float) -> tuple[int | None, str]:
        env = {**os.environ, GPU_STATE_ENV: str(self.gpu_state_dir)}
        self.gpu_state_dir.mkdir(parents=True, exist_ok=True)
        process = await asyncio.create_subprocess_shell(
            line,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            await asyncio.to_thread(kill_group, process.pid)
            with contextlib.suppress(ProcessLookupError):
                await process.wait()
            return None, f"`{line}` did not finish within {timeout_s:g}s"
        return process.returncode, output.decode(errors="replace").strip()[-500:]

    @activity.defn(name=PAUSE_TENANT.name)
    async def pause_tenant(self, command: TenantCommand) -> TenantCheck:
        tenant = command.tenant
        started = time.monotonic()
        code, output = await self._shell(tenant.pause, tenant.command_timeout_s)
        if code != 0:
            return TenantCheck(
                tenant=tenant.name,
                ok=False,
                detail=f"pause command `{tenant.pause}` failed (exit {code}): {output}",
            )
        memory = self._memory(command)
        deadline = started + tenant.free_timeout_s
        while True:
            used = memory.used_mib(tenant.gpus)
            waited = time.monotonic() - started
            if all(mib is not None and mib < tenant.free_below_mib for mib in used.values()):
                known = {i: mib for i, mib in used.items() if mib is not None}
                return TenantCheck(
                    tenant=tenant.name,
                    ok=True,
                    used_mib=known,
                    waited_s=round(waited, 3),
                    detail=f"GPUs {tenant.gpus} free after {waited:.1f}s (used MiB {known})",
                )
            activity.heartbeat({"used_mib": used, "waited_s": waited})
            if time.monotonic() >= deadline:
                unreadable = sorted(i for i, mib in used.items() if mib is None)
                why = (
                    f"GPU memory unreadable on {unreadable}: {getattr(memory, 'problem', '')}"
                    if unreadable
                    else "memory still in use after the pause command succeeded"
                )
                return TenantCheck(
                    tenant=tenant.name,
                    ok=False,
                    used_mib={i: mib for i, mib in used.items() if mib is not None},
                    waited_s=round(waited, 3),
                    detail=why,
                )
            await asyncio.sleep(CHECK_INTERVAL_S)

    @activity.defn(name=RESUME_TENANT.name)
    async def resume_tenant(self, command: TenantCommand) -> TenantCheck:
        tenant = command.tenant
        code, output = await self._shell(tenant.resume, tenant.command_timeout_s)
        if code != 0:
            # Retried by the keeper: a resume that never runs leaves the render queue down.
            raise RuntimeError(f"resume command `{tenant.resume}` failed (exit {code}): {output}")
        return TenantCheck(tenant=tenant.name, ok=True, detail="resumed")


class KeeperStoreActivities:
    """What the lease keepers read from the store: which of the tickets that bind constraints have passed."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @activity.defn(name=PASSED_TICKETS.name)
    async def passed_tickets(self, ticket_ids: list[str]) -> list[str]:
        return await asyncio.to_thread(self._passed, ticket_ids)

    def _passed(self, ticket_ids: list[str]) -> list[str]:
        with Session(self.engine) as session:
            rows = session.exec(
                select(TicketRow.ticket_id).where(
                    col(TicketRow.ticket_id).in_(ticket_ids), TicketRow.status == TicketStatus.PASSED.value
                )
            ).all()
        return sorted(rows)


class LeasedCommandActivities:
    """Run a command on this host under a GPU lease held for exactly as long as the command runs."""

    def __init__(self, artifacts: Path) -> None:
        self.artifacts = artifacts

    @activity.defn(name=RUN_LEASED.name)
    async def run_leased(self, step: LeasedCommand) -> LeasedRun:
        client = activity.client()
        request = step.request
        folder = self.artifacts / "leases" / step.host
        folder.mkdir(parents=True, exist_ok=True)
        log_path = folder / f"{request.lease_id}.log"
        started = datetime.now(UTC)
        waiting = asyncio.create_task(_heartbeat_while_waiting())
        try:
            async with holder.holding(client, step.host, request) as lease:
                waiting.cancel()
                seen = datetime.now(UTC)
                env = {**step.env, **gpu_environment(lease.gpus, request.lease_id)}
                finished = await run_logged(
                    step.command,
                    cwd=folder,
                    log_path=log_path,
                    timeout_s=step.timeout_s,
                    env=env,
                    heartbeat=activity.heartbeat,
                    heartbeat_every_s=min(2.0, step.heartbeat_s / 3),
                    # A worker killed mid-step leaves its command running: the retry kills that ghost first.
                    pidfile=folder / f"{request.lease_id}.pid",
                )
        except holder.LeaseRefused as error:
            return LeasedRun(acquire_started=started, refused=str(error))
        except holder.LeaseLost as error:
            return LeasedRun(
                acquire_started=started,
                lost=str(error),
                released_at=datetime.now(UTC),
                log_tail=log_tail(log_path, 600),
            )
        finally:
            waiting.cancel()
        return LeasedRun(
            lease=lease.outcome,
            returncode=finished.returncode,
            timed_out=finished.timed_out,
            acquire_started=started,
            granted_seen=seen,
            released_at=datetime.now(UTC),
            log_tail=finished.tail(600),
        )


async def _heartbeat_while_waiting() -> None:
    while True:
        activity.heartbeat("waiting for the lease")
        await asyncio.sleep(1.0)


class LeaseActivities:
    """Acquire and release on behalf of a workflow (workflows cannot send updates): control queue."""

    @activity.defn(name=ACQUIRE_LEASE.name)
    async def acquire_lease(self, call: LeaseAcquire) -> LeaseOutcome:
        beating = asyncio.create_task(_heartbeat_while_waiting())
        try:
            return await holder.acquire(activity.client(), call.host, call.request)
        except holder.LeaseRefused as error:
            raise ApplicationError(str(error), type=LEASE_REFUSED, non_retryable=True) from error
        finally:
            beating.cancel()

    @activity.defn(name=RELEASE_LEASE.name)
    async def release_lease(self, call: LeaseRelease) -> None:
        await holder.release(activity.client(), call.host, call.lease_id, call.reason)
