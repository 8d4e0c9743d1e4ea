"""LeasedStepWorkflow: one command on a host under a GPU lease held by its activity (`run_leased`, through
`daedalus.hosts.holder.holding`, which stops the command when the lease is revoked or cannot be renewed).

Only the pool bench (bench/pool.py) runs it. The product's steps (gates, campaign cells, training runs) hold their
leases from the workflow with `workflows.lease_helpers.holding_lease` around their own host activities; this one
stays while the bench measures a killed holder's and a revoked holder's fencing, which `holding_lease` (signals
only: a workflow cannot query the keeper) does not do yet."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import RUN_LEASED
    from daedalus.hosts.leases import LeasedCommand, LeasedRun


@workflow.defn
class LeasedStepWorkflow:
    @workflow.run
    async def run(self, step: LeasedCommand) -> LeasedRun:
        return await RUN_LEASED.execute(
            step,
            task_queue=step.task_queue,
            start_to_close_timeout=timedelta(seconds=step.wait_s + step.timeout_s + 60),
            heartbeat_timeout=timedelta(seconds=step.heartbeat_s),
            # A worker that dies mid-step is retried elsewhere (or on its restart); its lease expires meanwhile.
            retry_policy=RetryPolicy(maximum_attempts=5, initial_interval=timedelta(seconds=1)),
        )
