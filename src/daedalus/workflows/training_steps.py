"""A training run's steps outside itself: its GPU lease, the host report, its supervise segments on the host (the
watchdog, daedalus.training.supervisor), and the escalation with the hunting ticket it starts as a child."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Protocol

from temporalio import workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import SUPERVISE_TRAINING, TRAINING_HOST_REPORT
    from daedalus.decisions.schemas import (
        DecisionKind,
        DecisionRequest,
        DispatchRule,
        TrainingEscalationOption,
    )
    from daedalus.errors import TrainingInputError
    from daedalus.hosts.leases import LeaseRequest
    from daedalus.ids import host_queue, ticket_workflow_id
    from daedalus.schemas import search_attributes as sa
    from daedalus.schemas.audit import AuditKind
    from daedalus.schemas.gates import LeaseRecord
    from daedalus.schemas.ticket import TicketInput, TicketSpec
    from daedalus.schemas.training import (
        HostReport,
        HostReportInput,
        RunState,
        SegmentReport,
        SuperviseInput,
        TrainingRunSpec,
    )
    from daedalus.schemas.ui import start_details, start_summary
    from daedalus.training.hunt import hunting_ticket, hunting_ticket_id
    from daedalus.workflows import training_rules as rules
    from daedalus.workflows.lease_helpers import holding_lease
    from daedalus.workflows.steps import StepFailed, Steps
    from daedalus.workflows.training_evaluation import CheckpointEvaluations, EvaluatedRun

LEASE_PATCH = "training-holds-gpu-lease"
"""A run on a host with GPUs holds a lease on them from its first incarnation to its end (runs started before
had no GPU count in their input, so never take this branch; the patch marks the change all the same)."""
TRAINING_LEASE_PRIORITY = 30
"""Below a gate's 50: a long run yields to measurements queued behind it only by the keeper's aging rule, and a
tenant of higher priority may revoke it (hosts/leases.py)."""
HUNTING_TICKET_WORKFLOW = "TicketWorkflow"
"""By name, not by `TicketWorkflow.run`: the run never reads the hunt's result, and a typed start would decode
it (stored histories hold hunts whose test stand-in returned something else)."""


class SupervisedRun(EvaluatedRun, Protocol):
    """What of TrainingRunWorkflow its segments and its escalation use, besides what its evaluations do."""

    dispatch: DispatchRule | None
    segment: workflow.ActivityHandle[SegmentReport] | None
    evaluations: CheckpointEvaluations


@contextlib.asynccontextmanager
async def holding_gpus(spec: TrainingRunSpec, gpus: int) -> AsyncIterator[LeaseRecord | None]:
    """On a host with GPUs, the run holds a lease on all of them until it ends, kept across continue-as-new
    (a run continued as new acquires the same lease id again, which the keeper answers with the grant)."""
    if gpus == 0 or not workflow.patched(LEASE_PATCH):
        yield None
        return
    request = LeaseRequest(
        lease_id=f"{spec.workflow_id}/{workflow.info().first_execution_run_id[:8]}",
        holder=f"training run {spec.name}",
        purpose="training",
        gpus=list(range(gpus)),
        priority=TRAINING_LEASE_PRIORITY,
    )
    async with holding_lease(spec.host, request, kept_across_continue_as_new=True) as lease:
        yield LeaseRecord(lease_id=lease.lease_id, host=spec.host, gpus=lease.gpus)


async def host_report(steps: Steps, spec: TrainingRunSpec) -> HostReport | None:
    """What on the host may kill a trainer; None (and a warning) when the report failed."""
    report = await steps.on_host(
        TRAINING_HOST_REPORT,
        HostReportInput(host=spec.host),
        host=spec.host,
        timeout=timedelta(seconds=60),
        heartbeat=None,
        retry=RetryPolicy(maximum_attempts=3),
    )
    if isinstance(report, StepFailed):
        workflow.logger.warning("host report failed for %s: %s", spec.name, report.message)
        return None
    return report


def start_segment(inp: SuperviseInput) -> workflow.ActivityHandle[SegmentReport]:
    """One supervise segment on the run's host: the watchdog starts or re-attaches to the incarnation."""
    policy = inp.spec.watchdog
    return SUPERVISE_TRAINING.start(
        inp,
        task_queue=host_queue(inp.spec.host),
        start_to_close_timeout=timedelta(seconds=rules.segment_budget_s(policy)),
        heartbeat_timeout=timedelta(seconds=max(2.0, 5 * policy.sample_interval_s)),
        cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        # A host worker may be away for hours while the trainer runs on: keep trying to re-attach.
        retry_policy=RetryPolicy(
            initial_interval=timedelta(seconds=1),
            maximum_interval=timedelta(seconds=30),
            non_retryable_error_types=[TrainingInputError.type_name],
        ),
    )


async def open_hunting_ticket(spec: TicketSpec, run: TrainingRunSpec, dispatch: DispatchRule | None) -> None:
    """Start the hunting ticket, once: its deterministic id and REJECT_DUPLICATE keep a replay, a duplicated
    report or a restarted worker from opening a second."""
    try:
        await workflow.start_child_workflow(
            HUNTING_TICKET_WORKFLOW,
            TicketInput(
                spec=spec, filed_by=run.workflow_id, dispatch=rules.hunting_dispatch(dispatch, spec, run)
            ),
            id=ticket_workflow_id(spec.id),
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=sa.at_start(spec),
            static_summary=start_summary(spec),
            static_details=start_details(spec),
        )
    except WorkflowAlreadyStartedError:
        workflow.logger.info("hunting ticket %s is already open", spec.id)


async def supervise(run: SupervisedRun) -> SegmentReport:
    """The next segment's report; a `stop` cancels the segment, and the next one stops the trainer and collects
    its death. A spec the host refuses gives the run up."""
    leased = run.lease.environment() if run.lease else {}
    inp = SuperviseInput(
        spec=run.spec.changed(env={**run.spec.env, **leased}),
        incarnation=run.c.incarnation,
        stop_requested=run.c.stop is not None,
        resume_from=rules.resume_from(run.c),
        filing=workflow.info().first_execution_run_id,
        keep=run.evaluations.needed(),
    )
    while True:
        run.segment = start_segment(inp)
        try:
            if run.evaluations.on:
                await run.evaluations.beside(run.segment)
            return await run.segment
        except asyncio.CancelledError:
            if run.c.stop is None:
                raise  # the workflow itself is cancelled
            inp = inp.changed(stop_requested=True)
        except ActivityError as err:
            refused = TrainingInputError.failure_in(err)
            if refused is not None:
                run.c = run.c.changed(state=RunState.GAVE_UP)
                raise ApplicationError(
                    f"training run {run.spec.name} cannot start: {refused.message}", non_retryable=True
                ) from err
            if run.c.stop is None:
                raise
            # Cancelled by `stop`: the activity has stopped the trainer; the next segment collects the death.
            inp = inp.changed(stop_requested=True)
        finally:
            run.segment = None


async def escalate(run: SupervisedRun) -> None:
    """Open the hunting ticket (exactly one) and ask the decider whether to restart."""
    number = run.c.escalations + 1
    ticket_id = hunting_ticket_id(run.spec.name, number)
    counted = rules.counted_deaths(run.c)
    if run.evaluations.on:  # the desk asks one thing at a time: a deployment request waiting gives way
        if run.evaluations.answered:
            await run.evaluations.take_answer()  # answered as the segment ended: act on it first
        await run.evaluations.withdraw("withdrawn for the run's escalation; asked again after it", keep=True)
    if ticket_id not in run.c.hunting_tickets:
        await open_hunting_ticket(hunting_ticket(run.spec, ticket_id, counted), run.spec, run.dispatch)
        run.c = run.c.changed(hunting_tickets=[*run.c.hunting_tickets, ticket_id])
        await run.trail.record(
            AuditKind.HUNT,
            f"opened hunting ticket {ticket_id} for {run.spec.hunt.agent.value} after {len(counted)} deaths",
            detail={
                "ticket": ticket_id,
                "workflow_id": ticket_workflow_id(ticket_id),
                "deaths": ", ".join(d.id for d in counted),
            },
        )
    question, evidence = rules.escalation(run.spec.name, ticket_id, counted)
    run.c = run.c.changed(escalations=number)

    def awaiting(request: DecisionRequest) -> None:
        run.c = run.c.changed(state=RunState.AWAITING_DECISION)

    await run.desk.request(
        DecisionKind.ESCALATION,
        question,
        TrainingEscalationOption,
        evidence,
        ticket_id=ticket_id,
        before_write=awaiting,
    )
