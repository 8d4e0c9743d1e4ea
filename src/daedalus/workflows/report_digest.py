"""ReportDigestWorkflow: what the report schedule starts — one activity that writes the report and posts its
summary to Slack. Deterministic: it only schedules the activity."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import POST_REPORT_DIGEST
    from daedalus.schemas.report import DigestInput, DigestResult

REPORT_SCHEDULE_ID = "daedalus-report-digest"


@workflow.defn
class ReportDigestWorkflow:
    @workflow.run
    async def run(self, request: DigestInput) -> DigestResult:
        return await POST_REPORT_DIGEST.execute(
            request,
            start_to_close_timeout=timedelta(minutes=5),
            retry_policy=RetryPolicy(maximum_attempts=5, initial_interval=timedelta(seconds=5)),
        )
