"""The Temporal schedule that posts the report digest to Slack (`daedalus report-schedule`): a typed client of
ReportDigestWorkflow, so it sits in the services, above the workflows it starts."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from daedalus.schemas.report import DigestInput
from daedalus.workflows.report_digest import REPORT_SCHEDULE_ID, ReportDigestWorkflow


def digest_schedule(*, control_queue: str, every: timedelta, request: DigestInput) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            ReportDigestWorkflow.run, request, id=f"{REPORT_SCHEDULE_ID}-run", task_queue=control_queue
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        # a digest still being written when the next is due: skip the next, never post two at once
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def ensure_digest_schedule(
    client: Client,
    *,
    control_queue: str,
    every: timedelta,
    request: DigestInput,
    schedule_id: str = REPORT_SCHEDULE_ID,
) -> ScheduleHandle:
    """Create the schedule, or bring an existing one to this interval, window and link."""
    if every < timedelta(minutes=1):
        raise ValueError(f"a report digest every {every} would flood the channel; use at least 1 minute")
    schedule = digest_schedule(control_queue=control_queue, every=every, request=request)
    try:
        return await client.create_schedule(schedule_id, schedule)
    except ScheduleAlreadyRunningError:
        handle = client.get_schedule_handle(schedule_id)

        def replace(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await handle.update(replace)
        return handle
