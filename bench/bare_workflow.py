"""The lifecycle benchmark's baseline, in a module of its own so that it runs in the default workflow sandbox
(the sandbox re-imports a workflow's module; the benchmark script itself imports things a sandbox refuses)."""

from datetime import timedelta

from temporalio import workflow


@workflow.defn(name="BareWorkflow")
class BareWorkflow:
    """The baseline: the same number of trivial activities, on the same queues, in the same order, in the
    same (default, sandboxed) workflow runtime as TicketWorkflow."""

    @workflow.run
    async def run(self, queues: list[str]) -> int:
        for n, queue in enumerate(queues):
            await workflow.execute_activity(
                "noop", n, result_type=int, task_queue=queue, start_to_close_timeout=timedelta(seconds=30)
            )
        return len(queues)
