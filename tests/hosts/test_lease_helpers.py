"""holding_lease inside a workflow, around a host activity: contending workflows never overlap on a GPU, the
workflow's keepalives hold a short-ttl lease through a long step, and a refusal carries the keeper's reason."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError

from daedalus.activities.hosts import LeaseActivities
from daedalus.errors import LeaseRefused
from daedalus.hosts import holder
from daedalus.hosts.leases import LEASE_REFUSED, LeaseOutcome, LeaseRequest
from daedalus.ids import host_queue
from daedalus.schemas._base import Model
from daedalus.workflows.lease_helpers import holding_lease
from tests.hosts.keeper_support import running_keeper

SPANS: list[tuple[str, list[int], float, float]] = []


class Step(Model):
    host: str
    request: LeaseRequest
    seconds: float


@activity.defn(name="measure_on_gpus")
async def measure_on_gpus(step: Step, gpus: list[int]) -> None:
    start = time.monotonic()
    await asyncio.sleep(step.seconds)
    SPANS.append((step.host, gpus, start, time.monotonic()))


@workflow.defn(sandboxed=False)
class GateUnderLease:
    @workflow.run
    async def run(self, step: Step) -> LeaseOutcome:
        async with holding_lease(step.host, step.request) as lease:
            await workflow.execute_activity(
                "measure_on_gpus",
                args=[step, lease.gpus],
                task_queue=host_queue(step.host),
                start_to_close_timeout=timedelta(seconds=60),
            )
        return lease


async def test_workflows_hold_leases_around_their_host_steps(temporal_client: Client, tmp_path: Path) -> None:
    SPANS.clear()
    async with running_keeper(
        temporal_client,
        tmp_path,
        gpus=2,
        workflows=[GateUnderLease],
        control_activities=[LeaseActivities().acquire_lease, LeaseActivities().release_lease],
        host_activities=[measure_on_gpus],
    ) as keeper:

        async def gate(
            i: int, seconds: float = 0.3, ttl_s: float = 10, gpus: list[int] | None = None
        ) -> LeaseOutcome:
            request = LeaseRequest(lease_id=f"wf-{i}", holder=f"gate {i}", gpus=gpus or [0], ttl_s=ttl_s)
            return await temporal_client.execute_workflow(
                GateUnderLease.run,
                Step(host=keeper.host, request=request, seconds=seconds),
                id=f"gate-{uuid.uuid4()}",
                task_queue=keeper.control_queue,
            )

        leases = await asyncio.wait_for(asyncio.gather(*(gate(i) for i in range(4))), 120)
        assert sorted(lease.lease_id for lease in leases) == [f"wf-{i}" for i in range(4)]
        spans = sorted((s, e) for _, _, s, e in SPANS)
        assert len(spans) == 4
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
        # A 3 s ttl held through a 6 s step: the workflow's own keepalives (every ttl/3) keep it. A shorter ttl
        # would test the machine's scheduling, not the keepalives: a loaded CI box can stall a timer for 1 s.
        long = await gate(9, seconds=6, ttl_s=3)
        assert long.gpus == [0]
        state = await holder.keeper_state(temporal_client, keeper.host)
        assert state.counters.expired == 0 and state.held == [] and state.counters.released == 5
        with pytest.raises(WorkflowFailureError) as failed:
            await gate(10, gpus=[5])
        cause = failed.value.cause
        assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
        assert cause.cause.type == LEASE_REFUSED == LeaseRefused.__name__
        assert "GPU(s) [5] do not exist" in cause.cause.message
