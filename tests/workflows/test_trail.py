"""An audit trail that batches, on the real dev server: events recorded without waiting go in one write, in order,
the query's view moves only when they are written, and a write that fails for good fails the workflow."""

from __future__ import annotations

import uuid

import pytest
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from daedalus.activities.refs import RECORD_AUDIT_EVENTS
from daedalus.schemas.audit import AuditBatch, AuditKind
from daedalus.workflows.trail import AuditTrail


@workflow.defn(name="TrailProbe", sandboxed=False)
class TrailProbe:
    """Records `events` events without waiting, then flushes: (written seq before the flush, after it)."""

    @workflow.init
    def __init__(self, events: int) -> None:
        self.trail = AuditTrail("probe", status=lambda: "open", view=lambda seq: seq)
        self.trail.begin()

    @workflow.run
    async def run(self, events: int) -> tuple[int, int]:
        self.trail.batch_writes()
        for n in range(1, events + 1):
            await self.trail.record(AuditKind.TRANSITION, f"event {n}", wait=False)
        before = self.trail.written
        await self.trail.flush()
        return before, self.trail.written


class Store:
    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.batches: list[list[int]] = []

    @activity.defn(name=RECORD_AUDIT_EVENTS.name)
    async def record_audit_events(self, batch: AuditBatch) -> int:
        if self.refuse:
            raise ApplicationError("the store refused the batch", non_retryable=True)
        self.batches.append([record.event.seq for record in batch.records])
        return len(batch.records)


async def run_probe(client: Client, task_queue: str, store: Store, events: int) -> tuple[int, int]:
    async with Worker(
        client, task_queue=task_queue, workflows=[TrailProbe], activities=[store.record_audit_events]
    ):
        return await client.execute_workflow(
            TrailProbe.run,
            events,
            id=f"trail-{uuid.uuid4()}",
            task_queue=task_queue,
            result_type=tuple[int, int],
        )


async def test_events_recorded_without_waiting_go_in_one_write(
    temporal_client: Client, task_queue: str
) -> None:
    store = Store()
    assert await run_probe(temporal_client, task_queue, store, events=3) == (0, 3)
    assert store.batches == [[1, 2, 3]]


async def test_a_write_that_fails_for_good_fails_the_workflow_at_its_flush(
    temporal_client: Client, task_queue: str
) -> None:
    with pytest.raises(WorkflowFailureError) as failed:
        await run_probe(temporal_client, task_queue, Store(refuse=True), events=2)
    cause = failed.value.cause  # a local activity's failure reaches the workflow as the activity raised it
    assert isinstance(cause, ApplicationError) and cause.message == "the store refused the batch"
