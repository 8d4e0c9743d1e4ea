"""The lifecycle benchmark's baseline, in a module of its own so that it runs in the default workflow sandbox
(the sandbox re-imports a workflow's module; the benchmark script itself imports things a sandbox refuses)."""

from datetime import timedelta

from temporalio import workflow

LOCAL = "local"
"""In a shape: a local activity (run by the workflow's own worker, recorded as a marker)."""


@workflow.defn(name="BareWorkflow")
class BareWorkflow:
    """The baseline: the same number of trivial activities, on the same queues (or local where the ticket's are),
    in the same order, in the same (default, sandboxed) workflow runtime as TicketWorkflow."""

    @workflow.run
    async def run(self, shape: list[str]) -> int:
        timeout = timedelta(seconds=30)
        for n, queue in enumerate(shape):
            if queue == LOCAL:
                await workflow.execute_local_activity(
                    "noop", n, result_type=int, start_to_close_timeout=timeout
                )
            else:
                await workflow.execute_activity(
                    "noop", n, result_type=int, task_queue=queue, start_to_close_timeout=timeout
                )
        return len(shape)
