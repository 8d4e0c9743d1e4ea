"""Holding a GPU lease from inside a workflow, around the host activities that use the GPUs:

    request = LeaseRequest(lease_id=lease_id_for(workflow_id, "gate", name, f"round-{round}"), ...)
    async with holding_lease(spec.host, request) as lease:
        result = await RUN_GATE.execute(..., task_queue=host_queue(spec.host))
    # record lease.lease_id and lease.gpus with the verdict

The grant comes through the control-queue activity ACQUIRE_LEASE (a workflow cannot send updates); the
workflow itself keeps the lease alive with `keepalive` signals, so a host worker that dies mid-step does not
lose the lease while Temporal retries the step; the lease goes back with RELEASE_LEASE whatever happens. This
is the one way a workflow holds GPUs: gates, campaign cells, training runs and the pool bench's steps.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import ACQUIRE_LEASE, RELEASE_LEASE
    from daedalus.hosts.holder import KEEPALIVE
    from daedalus.hosts.leases import (
        LEASE_REFUSED,
        LeaseAcquire,
        LeaseOutcome,
        LeaseRelease,
        LeaseRequest,
        keeper_id,
    )

WAIT_LIMIT = timedelta(hours=12)
"""How long a step may queue for its GPUs (a long training run on them is the usual reason)."""


@asynccontextmanager
async def holding_lease(
    host: str,
    request: LeaseRequest,
    *,
    wait: timedelta = WAIT_LIMIT,
    kept_across_continue_as_new: bool = False,
) -> AsyncIterator[LeaseOutcome]:
    """Hold `request` on `host` for the body. A refusal raises ActivityError whose cause is an ApplicationError
    of type LEASE_REFUSED, with the keeper's reason. With `kept_across_continue_as_new`, a body that continues as
    new leaves the lease held for the next run, which acquires the same `lease_id` again (idempotent) and keeps
    it alive from there: a training run's GPUs are never free between two runs of its workflow."""
    lease = await ACQUIRE_LEASE.execute(
        LeaseAcquire(host=host, request=request),
        start_to_close_timeout=wait,
        heartbeat_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=0, non_retryable_error_types=[LEASE_REFUSED]),
    )
    keeper = workflow.get_external_workflow_handle(keeper_id(host))

    async def keep_alive() -> None:
        while True:
            await workflow.sleep(timedelta(seconds=request.ttl_s / 3))
            await keeper.signal(KEEPALIVE, request.lease_id)

    beating = asyncio.create_task(keep_alive())
    release = True
    try:
        yield lease
    except workflow.ContinueAsNewError:
        release = not kept_across_continue_as_new
        raise
    finally:
        beating.cancel()
        if release:
            # Released even when the body failed or the workflow is being cancelled.
            await asyncio.shield(
                RELEASE_LEASE.execute(
                    LeaseRelease(host=host, lease_id=request.lease_id),
                    start_to_close_timeout=timedelta(minutes=2),
                    retry_policy=RetryPolicy(maximum_attempts=5),
                )
            )
