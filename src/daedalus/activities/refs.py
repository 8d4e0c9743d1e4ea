"""Every activity a workflow calls, declared once with its name, its input and its output.

Workflows call `RUN_ATTEMPT.execute(AttemptInput(...), ...)` and get an `AgentResult` back, checked by mypy;
each `@activity.defn` takes its name from here, and tests/activities/test_refs.py checks that the definitions'
signatures match these declarations. This module imports schemas only (and the lease calls' models from hosts/leases.py, free of I/O), so workflows import it without pulling
in the agents, engines or store that the activities themselves need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from temporalio import workflow

from daedalus.decisions.schemas import DecisionRequest
from daedalus.hosts.leases import (
    LeaseAcquire,
    LeasedCommand,
    LeasedRun,
    LeaseOutcome,
    LeaseRelease,
    TenantCheck,
    TenantCommand,
)
from daedalus.schemas.agents import AgentResult
from daedalus.schemas.audit import AuditBatch, AuditRecord
from daedalus.schemas.gates import GateResult
from daedalus.schemas.lessons import LessonBatch, LessonQuery
from daedalus.schemas.notify import NotifyResult
from daedalus.schemas.report import DigestInput, DigestResult
from daedalus.schemas.steps import AttemptInput, BuildInput, BuildResult, GateInput
from daedalus.schemas.training import (
    CheckpointEvaluated,
    DeploymentInput,
    DeploymentResult,
    EvaluationInput,
    HostReport,
    HostReportInput,
    SegmentReport,
    SuperviseInput,
)

In = TypeVar("In")
Out = TypeVar("Out")


@dataclass(frozen=True)
class ActivityRef(Generic[In, Out]):
    """An activity as a workflow sees it: called by name, its argument and result typed."""

    name: str
    input: type[In]
    output: type[Out]

    async def execute(self, argument: In, **options: Any) -> Out:
        """`workflow.execute_activity` with this activity's name and result type (workflow code only)."""
        result: Out = await workflow.execute_activity(self.name, argument, result_type=self.output, **options)
        return result

    async def execute_local(self, argument: In, **options: Any) -> Out:
        """`workflow.execute_local_activity`: run by the workflow's own worker, its result recorded as a marker
        in the workflow's history (workflow code only; the worker must register the activity)."""
        result: Out = await workflow.execute_local_activity(
            self.name, argument, result_type=self.output, **options
        )
        return result

    def start(self, argument: In, **options: Any) -> workflow.ActivityHandle[Out]:
        """`workflow.start_activity`: a handle the workflow can cancel (workflow code only)."""
        handle: workflow.ActivityHandle[Out] = workflow.start_activity(
            self.name, argument, result_type=self.output, **options
        )
        return handle


RUN_ATTEMPT = ActivityRef("run_attempt", AttemptInput, AgentResult)
RUN_BUILD = ActivityRef("run_build", BuildInput, BuildResult)
RUN_GATE = ActivityRef("run_gate", GateInput, GateResult)
RECORD_AUDIT_EVENT = ActivityRef("record_audit_event", AuditRecord, bool)
RECORD_AUDIT_EVENTS = ActivityRef("record_audit_events", AuditBatch, int)
NOTIFY_DECISION_REQUEST = ActivityRef("notify_decision_request", DecisionRequest, NotifyResult)
SUPERVISE_TRAINING = ActivityRef("supervise_training", SuperviseInput, SegmentReport)
TRAINING_HOST_REPORT = ActivityRef("training_host_report", HostReportInput, HostReport)
EVALUATE_CHECKPOINT = ActivityRef("evaluate_checkpoint", EvaluationInput, CheckpointEvaluated)
DEPLOY_CHECKPOINT = ActivityRef("deploy_checkpoint", DeploymentInput, DeploymentResult)
RECORD_LESSONS = ActivityRef("record_lessons", LessonBatch, int)
LESSONS_FOR = ActivityRef("lessons_for", LessonQuery, list[str])
POST_REPORT_DIGEST = ActivityRef("post_report_digest", DigestInput, DigestResult)
ACQUIRE_LEASE = ActivityRef("acquire_lease", LeaseAcquire, LeaseOutcome)
RELEASE_LEASE = ActivityRef("release_lease", LeaseRelease, type(None))
PAUSE_TENANT = ActivityRef("pause_tenant", TenantCommand, TenantCheck)
RESUME_TENANT = ActivityRef("resume_tenant", TenantCommand, TenantCheck)
PASSED_TICKETS = ActivityRef("passed_tickets", list[str], list[str])
RUN_LEASED = ActivityRef("run_leased", LeasedCommand, LeasedRun)

WORKFLOW_ACTIVITIES: tuple[ActivityRef[Any, Any], ...] = (
    RUN_ATTEMPT,
    RUN_BUILD,
    RUN_GATE,
    RECORD_AUDIT_EVENT,
    RECORD_AUDIT_EVENTS,
    NOTIFY_DECISION_REQUEST,
    SUPERVISE_TRAINING,
    TRAINING_HOST_REPORT,
    EVALUATE_CHECKPOINT,
    DEPLOY_CHECKPOINT,
    RECORD_LESSONS,
    LESSONS_FOR,
    POST_REPORT_DIGEST,
    ACQUIRE_LEASE,
    RELEASE_LEASE,
    PAUSE_TENANT,
    RESUME_TENANT,
    PASSED_TICKETS,
    RUN_LEASED,
)
