"""TrainingRunWorkflow: one training run (id `training-<name>`), supervised incarnation after incarnation.

The watchdog runs on the host as a sequence of short `supervise_training` activities; each one starts or
re-attaches to the current incarnation and reports memory, slope and checkpoint, or the incarnation's death.
Deaths are recorded once per id. The third counted death escalates to the decider and opens one hunting
ticket, whose deterministic id (and REJECT_DUPLICATE) keeps a replay, a duplicated report or a restarted
worker from opening a second.

Every transition (started/restarted, each death, hunting ticket opened, escalation requested, decision, ended)
is one audit event with subject `training-<name>`, written by `record_audit_event` on the workflow's own
(control) queue and idempotent on (first run id, seq); the seq counter travels in the carry across
continue-as-new, because the first run id stays the same along the chain.

A run with an `evaluation` (patch `EVALUATION_PATCH`) measures every complete checkpoint the watchdog reports,
on its host and confined as a gate is (`evaluate_checkpoint`), one after another while the supervision goes on;
each verdict is an audit event that carries the verdict itself. A checkpoint that clears the bar and beats every
one proposed before is proposed for its serving preset: a deployment decision through the run's decision desk,
asked while the trainer goes on, and on approval a commit the host makes in the serving-config repository
(`deploy_checkpoint`), recorded with its sha. The desk holds one request at a time: an escalation withdraws a
pending deployment request and the proposal is asked again once the escalation is answered. A run that
finishes evaluates its last checkpoints and waits for a pending deployment decision before it closes.

Only the run's one coroutine issues commands: it waits for its segment, an evaluation's end or a deployment's
answer, whichever comes first, and acts on it (`_evaluation_turn`). A second coroutine issuing activities and
timers beside it would order its commands by when local activities (the audit writes) resolve, which a replay
may group differently, and fail the replay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import (
        DEPLOY_CHECKPOINT,
        EVALUATE_CHECKPOINT,
        SUPERVISE_TRAINING,
        TRAINING_HOST_REPORT,
    )
    from daedalus.decisions.desk import DecisionDesk, Waiting
    from daedalus.decisions.schemas import (
        Decision,
        DecisionKind,
        Delegation,
        DeploymentOption,
        DeskState,
        DispatchOption,
        DispatchRule,
        TrainingEscalationOption,
        TrainingRunSubject,
    )
    from daedalus.errors import TrainingInputError
    from daedalus.hosts.leases import LeaseRequest
    from daedalus.ids import host_queue, ticket_workflow_id
    from daedalus.schemas import search_attributes as sa
    from daedalus.schemas.audit import WITHDRAWS_REQUEST, AuditKind, TrailState
    from daedalus.schemas.gates import METRIC_DIRECTIONS, Direction, GateResult, LeaseRecord, Verdict
    from daedalus.schemas.ticket import AgentSpec, TicketInput, TicketKind, TicketSpec
    from daedalus.schemas.training import (
        COUNTED_DEATHS,
        CheckpointEvaluated,
        CheckpointEvaluation,
        Death,
        DeathClass,
        Deployment,
        DeploymentInput,
        DeploymentOutcome,
        DeploymentPolicy,
        EvaluationInput,
        HostReport,
        HostReportInput,
        ProgressReading,
        RunState,
        SegmentReport,
        StopTraining,
        SuperviseInput,
        TrainingRunInput,
        TrainingRunSpec,
        TrainingRunStatus,
    )
    from daedalus.schemas.ui import start_details, start_summary
    from daedalus.workflows.lease_helpers import holding_lease
    from daedalus.workflows.patches import PatchesAtStart
    from daedalus.workflows.steps import StepFailed, Steps, failed_step, history_is_long
    from daedalus.workflows.ticket_rules import tree_commands
    from daedalus.workflows.trail import AuditTrail

AUDIT_PATCH = "training-audit-events"
"""Histories recorded before runs wrote audit events replay without them (tests/histories/training-v1-*)."""
DESK_PATCH = "training-decision-desk"
"""Escalations posted to Slack and reminded, as a ticket's are; histories recorded before (training-escalation,
training-reattach) replay without the notifications and reminders. Asked lazily, at the first notification, by
runs started before `DESK_AT_START_PATCH`; never asked by runs started after it."""
DESK_AT_START_PATCH = "training-decision-desk-at-start"
"""The desk is on, decided in the run's first activation (workflows/patches.py says why: `DESK_PATCH` was asked
first right after an audit write, a local activity)."""
HUNTING_TICKET_WORKFLOW = "TicketWorkflow"
"""By name, not by `TicketWorkflow.run`: the run never reads the hunt's result, and a typed start would decode
it (stored histories hold hunts whose test stand-in returned something else)."""
LAUNCH_ALLOWANCE_S = 60.0
LEASE_PATCH = "training-holds-gpu-lease"
"""A run on a host with GPUs holds a lease on them from its first incarnation to its end (runs started before
had no GPU count in their input, so never take this branch; the patch marks the change all the same)."""
TRAINING_LEASE_PRIORITY = 30
"""Below a gate's 50: a long run yields to measurements queued behind it only by the keeper's aging rule, and a
tenant of higher priority may revoke it (hosts/leases.py)."""
ENDED = (RunState.STOPPED, RunState.FINISHED, RunState.GAVE_UP)
EVALUATION_PATCH = "training-checkpoint-evaluation"
"""Runs report their progress, evaluate their checkpoints and propose the ones that clear the bar for a serving
preset (`spec.evaluation`). Asked in the run's first activation (patches.py says why there); histories recorded
before it (every stored training-*.json) have no evaluation and replay without it."""
EVALUATIONS_KEPT = 20
"""Evaluations and deployments the run keeps in its state (the store keeps them all)."""
SEEN_KEPT = 64
"""Checkpoints remembered as evaluated or skipped, so a report listing them again never queues them twice."""
DEPLOY_TIMEOUT = timedelta(seconds=120)
EVALUATION_ALLOWANCE_S = 120
"""Beyond the evaluation gate's own timeout: the sandbox's start, the verdict."""


def median(values: list[float]) -> float | None:
    """The median, without numpy (workflow code)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def progress_detail(progress: ProgressReading | None) -> dict[str, str]:
    """A progress reading as audit detail, for the report (which reads the store, never the workflow)."""
    if progress is None:
        return {}
    detail = {"step": str(progress.step), "progress": progress.summary()}
    if progress.target_steps is not None:
        detail["target_steps"] = str(progress.target_steps)
    if progress.steps_per_s is not None:
        detail["steps_per_s"] = f"{progress.steps_per_s:.4g}"
    if progress.tokens_per_s is not None:
        detail["tokens_per_s"] = f"{progress.tokens_per_s:.4g}"
    if progress.eta_s is not None:
        detail["eta_s"] = f"{progress.eta_s:.0f}"
    return detail


def hunting_ticket_id(run: str, escalation: int) -> str:
    return f"hunt-{run}-{escalation}"


def deaths_side_by_side(deaths: list[Death]) -> str:
    """The deaths as the seed's table: run, outcome, cause, with the evidence's paths."""
    lines = [
        "| incarnation | class | lived | min available | slope | cause | evidence |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in deaths:
        avail = f"{d.min_available_gib:.1f} GiB" if d.min_available_gib is not None else "-"
        slope = f"{d.slope_gib_per_h:+.2f} GiB/h" if d.slope_gib_per_h is not None else "-"
        lines.append(
            f"| {d.id} | {d.death_class.value} | {d.lifetime_s / 60:.1f} min | {avail} | {slope} | {d.summary} "
            f"| {d.curve_path or '-'}, {d.log_tail_path or '-'} |"
        )
    return "\n".join(lines)


@workflow.defn(name="TrainingRunWorkflow")
class TrainingRunWorkflow:
    @workflow.init
    def __init__(self, inp: TrainingRunInput) -> None:
        self.spec: TrainingRunSpec = inp.spec
        self.started_by = inp.started_by
        self.dispatch = inp.dispatch
        self.c = inp.carry
        self.segment: workflow.ActivityHandle[SegmentReport] | None = None
        c = self.c  # a carry written before the desk and the trail keeps their state in its own fields
        desk = c.desk or DeskState(
            pending=c.pending_decision,
            decisions=c.decisions,
            requests_made=c.escalations,
            delegates={k: list(v) for k, v in self.spec.approval.delegates.items()},
        )
        self.patches = PatchesAtStart(DESK_AT_START_PATCH)
        self.trail = AuditTrail(
            self.spec.workflow_id,
            status=lambda: self.c.state.value,
            view=lambda seq: (self.c.state, self.desk.pending),
            carried=c.trail or TrailState(seq=c.audit_seq, status=c.state.value),
            writes=lambda: workflow.patched(AUDIT_PATCH),
        )
        self.desk = DecisionDesk(
            TrainingRunSubject(run=self.spec.name),
            self.spec.workflow_id,
            self.trail,
            desk,
            deciders=lambda: self.spec.approval.deciders,
            notify=self._notifies,
        )
        self.steps = Steps(lambda: False)
        self.gpus = inp.gpus
        self.lease: LeaseRecord | None = None
        self.evaluating = False
        """EVALUATION_PATCH is on and the run has an evaluation: checkpoints are evaluated and proposed."""
        self._run_over = False
        self._evaluation: workflow.ActivityHandle[CheckpointEvaluated] | None = None
        self._evaluating_now: str | None = None
        self._deployment_answered = False
        self.trail.begin()

    # ---- queries, updates, signals --------------------------------------------------------------------

    @workflow.query
    def status(self) -> TrainingRunStatus:
        """The run as its audit trail in the store shows it: its state and pending decision never run ahead
        of the writes (memory, slope and checkpoint are the watchdog's latest report)."""
        state, pending = self.trail.written
        report = self.c.last_report
        return TrainingRunStatus(
            name=self.spec.name,
            host=self.spec.host,
            state=state,
            incarnation=self.c.incarnation,
            memory_now=report.memory_now if report else None,
            slope_gib_per_h=report.slope_gib_per_h if report else None,
            leak_flagged=report.leak_flagged if report else False,
            last_checkpoint=report.last_checkpoint if report else None,
            trainer_pid=report.trainer_pid if report and report.death is None else None,
            deaths=self.c.deaths,
            death_counter=self.c.death_counter,
            hunting_tickets=self.c.hunting_tickets,
            pending_decision=pending,
            host_report=self.c.host_report,
            continued=self.c.continued,
            audit_seq=self.trail.written_seq,
            started_by=self.started_by,
            progress=report.progress if report else None,
            wakeups=report.wakeups if report else None,
            evaluations=self.c.evaluations,
            waiting_evaluation=self.c.waiting,
            deployments=self.c.deployments,
        )

    @workflow.update
    def decide(self, decision: Decision) -> TrainingRunStatus:
        """Answer the pending request; the validator has checked id, option and authority."""
        pending = self.desk.pending
        if pending is not None and pending.kind is DecisionKind.DEPLOYMENT:
            self._deployment_answered = True  # the run's loop acts on it between its steps
        self.desk.answer(decision)
        return self.status()

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        self.desk.validate(decision, self.c.state.value)

    @workflow.update
    async def delegate(self, delegation: Delegation) -> list[str]:
        """A decider lets someone else decide the run's escalations on their behalf."""
        return await self.desk.delegate(delegation)

    @delegate.validator
    def _validate_delegate(self, delegation: Delegation) -> None:
        self.desk.validate_delegation(delegation)
        self._validate_stop(StopTraining(requested_by=delegation.granted_by))

    @workflow.update
    def stop(self, request: StopTraining) -> TrainingRunStatus:
        """Stop the run gracefully (checkpoint signal first); the current segment is cancelled at once."""
        self.c = self.c.changed(stop=request)
        if self.segment is not None and not self.segment.done():
            self.segment.cancel()
        return self.status()

    @stop.validator
    def _validate_stop(self, request: StopTraining) -> None:
        if self.c.state in ENDED and not (self._run_over and self.evaluating and self.c.stop is None):
            raise ValueError(f"training run {self.spec.name} has already ended ({self.c.state.value})")

    @workflow.signal
    async def report_death(self, death: Death) -> None:
        """A death reported from outside the watchdog (an operator, a host monitor); recorded once per id."""
        if death.incarnation <= self.c.incarnation and self._record_death(death):
            await self._audit_death(death, actor="report")

    # ---- the run -------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: TrainingRunInput) -> TrainingRunStatus:
        self.patches.decide()
        # Decided by the spec first: a run without an evaluation records no marker for it.
        self.evaluating = self.spec.evaluation is not None and workflow.patched(EVALUATION_PATCH)
        if inp.dispatch is not None and inp.dispatch.required and not await self._dispatched(inp.dispatch):
            await self.trail.record(AuditKind.CLOSED, self._ending(), actor=self._ended_by())
            return self.status()
        if self.c.host_report is None:
            self._set(host_report=await self._host_report())
        async with self._holding_gpus():
            try:
                await self._live()
            except ApplicationError as err:
                if self.c.state is RunState.GAVE_UP:
                    await self.trail.record(AuditKind.CLOSED, f"gave up: {err.message}")
                raise
            if self.evaluating:
                self._run_over = True  # a finished run evaluates what is left and waits for its proposal
                await self._finish_evaluations()
        await self.trail.record(AuditKind.CLOSED, self._ending(), actor=self._ended_by())
        return self.status()

    @contextlib.asynccontextmanager
    async def _holding_gpus(self) -> AsyncIterator[None]:
        """On a host with GPUs, the run holds a lease on all of them until it ends, kept across continue-as-new
        (a run continued as new acquires the same lease id again, which the keeper answers with the grant)."""
        if self.gpus == 0 or not workflow.patched(LEASE_PATCH):
            yield
            return
        host = self.spec.host
        request = LeaseRequest(
            lease_id=f"{self.spec.workflow_id}/{workflow.info().first_execution_run_id[:8]}",
            holder=f"training run {self.spec.name}",
            purpose="training",
            gpus=list(range(self.gpus)),
            priority=TRAINING_LEASE_PRIORITY,
        )
        async with holding_lease(host, request, kept_across_continue_as_new=True) as lease:
            self.lease = LeaseRecord(lease_id=lease.lease_id, host=host, gpus=lease.gpus)
            try:
                yield
            finally:
                self.lease = None

    async def _dispatched(self, rule: DispatchRule) -> bool:
        """The server's policy requires a dispatch decision before anything runs on the host (the starter does
        not operate it): ask, and wait. False when it was rejected or the run was stopped while waiting.
        Only a first run asks: its continuation's input carries the rule no longer required (`_continue_as_new`)."""
        question = f"Start training run {self.spec.name} on {self.spec.host}? ({rule.reason})"
        waiting = Waiting(
            reminder=timedelta(seconds=self.spec.approval.reminder_interval_s),
            interrupted=lambda: self.c.stop is not None,
        )
        answer = await self.desk.ask(
            DecisionKind.DISPATCH,
            question,
            DispatchOption,
            [f"runs {line}" for line in rule.commands],
            waiting,
            ticket_id=self.spec.workflow_id,
            before_write=lambda request: self._set(state=RunState.AWAITING_DECISION),
            excluded=rule.excluded,
        )
        if answer is None or answer.option is DispatchOption.REJECT:
            self.desk.withdraw()
            if answer is not None:
                self._set(
                    stop=StopTraining(requested_by=answer.decision.decided_by, reason="dispatch rejected")
                )
            self._set(state=RunState.STOPPED)
            return False
        self._set(state=RunState.STARTING)
        return True

    async def _live(self) -> None:
        """Supervise incarnation after incarnation until the run ends (or continues as new)."""
        while True:
            if self.c.state is RunState.AWAITING_DECISION:
                await self._await_decision()
                if self.c.state is RunState.STOPPED:
                    return
            if self.c.stop is not None and self.c.state is RunState.RESTARTING:
                self._set(state=RunState.STOPPED)  # stopped between incarnations: nothing to start
                return
            if self.c.state in (RunState.STARTING, RunState.RESTARTING):
                verb = "started" if self.c.state is RunState.STARTING else "restarted"
                self._set(state=RunState.RUNNING, incarnation_started_at=workflow.now())
                await self._audit_start(verb)
            report = await self._supervise()
            self._set(last_report=report)
            if self.evaluating:
                self._queue(report.checkpoints)
            if report.death is not None:
                if self._record_death(report.death):
                    await self._audit_death(report.death)
                if await self._after_death(report.death):
                    return
            if history_is_long(self.spec.history_limit):
                # An evaluation in flight is dropped: its checkpoint, first in line, is evaluated again.
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._continue_as_new()

    def _continue_as_new(self) -> NoReturn:
        carry = self.c.model_copy(
            update={
                "continued": self.c.continued + 1,
                "desk": self.desk.state,
                "trail": self.trail.carry(),
                "pending_decision": None,
                "decisions": [],
                "audit_seq": 0,
            }
        )
        # The run was dispatched (or needed no decision) before its first incarnation: its rule goes on, no
        # longer required, for its hunting tickets.
        dispatched = self.dispatch.changed(required=False) if self.dispatch else None
        workflow.continue_as_new(
            TrainingRunInput(
                spec=self.spec, carry=carry, gpus=self.gpus, started_by=self.started_by, dispatch=dispatched
            )
        )

    def _set(self, **changes: object) -> None:
        self.c = self.c.changed(**changes)

    def _notifies(self) -> bool:
        """Whether requests are posted and reminded."""
        return self.patches.patched(DESK_PATCH)

    # ---- audit ---------------------------------------------------------------------------------------

    async def _audit_start(self, verb: str) -> None:
        resume = self._resume_from()
        detail = {"incarnation": str(self.c.incarnation), "host": self.spec.host}
        if resume:
            detail["resume_from"] = resume
        if self.c.host_report is not None:
            detail["host_report"] = self.c.host_report.summary()
        await self.trail.record(
            AuditKind.TRAINING,
            f"{verb} incarnation {self.c.incarnation} on {self.spec.host}"
            + (f", resuming from {resume}" if resume else ""),
            actor=self.started_by if verb == "started" else "daedalus",
            detail=detail,
        )

    async def _audit_death(self, death: Death, actor: str = "watchdog") -> None:
        detail: dict[str, Any] = {
            **progress_detail(death.progress),
            "death_id": death.id,
            "incarnation": death.incarnation,
            "class": death.death_class.value,
            "exit_code": death.exit_code,
            "signal": death.signal,
            "lifetime_s": f"{death.lifetime_s:.1f}",
            "last_checkpoint": death.last_checkpoint,
            "min_available_gib": death.min_available_gib,
            "slope_gib_per_h": death.slope_gib_per_h,
            "curve": death.curve_path,
            "log_tail": death.log_tail_path,
            "death_counter": self.c.death_counter,
            "stop_trigger": death.stop_trigger,
            "cgroup_peak_bytes": death.cgroup_peak_bytes,
        }
        await self.trail.record(
            AuditKind.DEATH,
            f"{death.id} died: {death.death_class.value}: {death.summary}",
            actor=actor,
            detail={k: str(v) for k, v in detail.items() if v is not None},
        )

    def _ending(self) -> str:
        state = self.c.state
        if state is RunState.STOPPED and self.c.stop is not None:
            return f"stopped by {self.c.stop.requested_by}: {self.c.stop.reason}"
        last = self.c.deaths[-1] if self.c.deaths else None
        decisions = self.desk.state.decisions
        if state is RunState.STOPPED and decisions and decisions[-1].option == TrainingEscalationOption.STOP:
            return f"stopped by {decisions[-1].decided_by}'s decision after {len(self.c.deaths)} deaths"
        cause = f" after {last.id}: {last.summary}" if last is not None else ""
        return f"{state.value}{cause}"

    def _ended_by(self) -> str:
        if self.c.stop is not None:
            return self.c.stop.requested_by
        last = self.desk.state.decisions[-1] if self.desk.state.decisions else None
        if (
            self.c.state is RunState.STOPPED
            and last is not None
            and last.option == TrainingEscalationOption.STOP
        ):
            return last.decided_by
        return "daedalus"

    async def _host_report(self) -> HostReport | None:
        report = await self.steps.on_host(
            TRAINING_HOST_REPORT,
            HostReportInput(host=self.spec.host),
            host=self.spec.host,
            timeout=timedelta(seconds=60),
            heartbeat=None,
            retry=RetryPolicy(maximum_attempts=3),
        )
        if isinstance(report, StepFailed):
            workflow.logger.warning("host report failed for %s: %s", self.spec.name, report.message)
            return None
        return report

    async def _supervise(self) -> SegmentReport:
        policy = self.spec.watchdog
        leased = self.lease.environment() if self.lease else {}
        inp = SuperviseInput(
            spec=self.spec.changed(env={**self.spec.env, **leased}),
            incarnation=self.c.incarnation,
            stop_requested=self.c.stop is not None,
            resume_from=self._resume_from(),
            filing=workflow.info().first_execution_run_id,
            keep=self._needed(),
        )
        budget = (
            policy.report_interval_s + policy.checkpoint_grace_s + policy.term_grace_s + LAUNCH_ALLOWANCE_S
        )
        while True:
            self.segment = SUPERVISE_TRAINING.start(
                inp,
                task_queue=host_queue(self.spec.host),
                start_to_close_timeout=timedelta(seconds=budget),
                heartbeat_timeout=timedelta(seconds=max(2.0, 5 * policy.sample_interval_s)),
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                # A host worker may be away for hours while the trainer runs on: keep trying to re-attach.
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=30),
                    non_retryable_error_types=[TrainingInputError.type_name],
                ),
            )
            try:
                if self.evaluating:
                    await self._beside_the_segment(self.segment)
                return await self.segment
            except asyncio.CancelledError:
                if self.c.stop is None:
                    raise  # the workflow itself is cancelled
                inp = inp.changed(stop_requested=True)
            except ActivityError as err:
                refused = TrainingInputError.failure_in(err)
                if refused is not None:
                    self._set(state=RunState.GAVE_UP)
                    raise ApplicationError(
                        f"training run {self.spec.name} cannot start: {refused.message}", non_retryable=True
                    ) from err
                if self.c.stop is None:
                    raise
                # Cancelled by `stop`: the activity has stopped the trainer; the next segment collects the death.
                inp = inp.changed(stop_requested=True)
            finally:
                self.segment = None

    def _resume_from(self) -> str | None:
        """The checkpoint the current incarnation starts from: the one its predecessor left."""
        last = self.c.deaths[-1] if self.c.deaths else None
        if last is not None and last.incarnation == self.c.incarnation - 1:
            return last.last_checkpoint
        return None

    def _record_death(self, death: Death) -> bool:
        """Record a death once; True when it was new."""
        if any(d.id == death.id for d in self.c.deaths):
            return False
        counter = self.c.death_counter
        stable = self.spec.restart.reset_after_stable_s
        if stable is not None and death.lifetime_s >= stable:
            counter = 0  # it lived long enough: the earlier deaths are history, not a loop
        if death.death_class in COUNTED_DEATHS:
            counter += 1
        self._set(deaths=[*self.c.deaths, death], death_counter=counter)
        workflow.logger.info(
            "run %s: death %s (%s), counter %d", self.spec.name, death.id, death.death_class, counter
        )
        return True

    async def _after_death(self, death: Death) -> bool:
        """Restart, escalate or end after the current incarnation's death; True when the run is over."""
        if death.death_class is DeathClass.CLEAN_EXIT:
            self._set(state=RunState.FINISHED)
            return True
        if death.death_class is DeathClass.REQUESTED_STOP or self.c.stop is not None:
            self._set(state=RunState.STOPPED)
            return True
        if self.c.death_counter >= self.spec.restart.escalate_after_deaths:
            await self._escalate()
            return False
        if not self.spec.restart.restart:
            self._set(state=RunState.GAVE_UP)
            return True
        await self._restart_after_delay()
        return False

    async def _restart_after_delay(self) -> None:
        self._set(state=RunState.RESTARTING)
        if self.spec.restart.restart_delay_s > 0:
            with contextlib.suppress(TimeoutError):  # the delay ran out: restart
                await workflow.wait_condition(
                    lambda: self.c.stop is not None,
                    timeout=timedelta(seconds=self.spec.restart.restart_delay_s),
                )
        self._set(incarnation=self.c.incarnation + 1)

    async def _escalate(self) -> None:
        """Open the hunting ticket (exactly one) and ask the decider whether to restart."""
        number = self.c.escalations + 1
        ticket_id = hunting_ticket_id(self.spec.name, number)
        counted = [d for d in self.c.deaths if d.death_class in COUNTED_DEATHS][-self.c.death_counter :]
        if self.evaluating:  # the desk asks one thing at a time: a deployment request waiting gives way
            if self._deployment_answered:
                await self._take_answer()  # answered as the segment ended: act on it first
            await self._withdraw_proposal(
                "withdrawn for the run's escalation; asked again after it", keep=True
            )
        if ticket_id not in self.c.hunting_tickets:
            await self._open_hunting_ticket(ticket_id, counted)
            self._set(hunting_tickets=[*self.c.hunting_tickets, ticket_id])
            await self.trail.record(
                AuditKind.HUNT,
                f"opened hunting ticket {ticket_id} for {self.spec.hunt.agent.value} after {len(counted)} deaths",
                detail={
                    "ticket": ticket_id,
                    "workflow_id": ticket_workflow_id(ticket_id),
                    "deaths": ", ".join(d.id for d in counted),
                },
            )
        question = (
            f"Training run {self.spec.name} died {len(counted)} times; hunting ticket {ticket_id} is open. "
            f"Restart from the last checkpoint, or stop the run?"
        )
        evidence = [f"{d.id}: {d.death_class.value}: {d.summary} ({d.curve_path})" for d in counted]
        self._set(escalations=number)
        await self.desk.request(
            DecisionKind.ESCALATION,
            question,
            TrainingEscalationOption,
            evidence,
            ticket_id=ticket_id,
            before_write=lambda request: self._set(state=RunState.AWAITING_DECISION),
        )

    async def _open_hunting_ticket(self, ticket_id: str, deaths: list[Death]) -> None:
        spec = TicketSpec(
            id=ticket_id,
            title=f"Hunt the repeating death of training run {self.spec.name} on {self.spec.host}",
            kind=TicketKind.HUNT,
            host=self.spec.host,
            engine=self.spec.hunt.engine,
            agent=AgentSpec(name=self.spec.hunt.agent, model=self.spec.hunt.model),
            spec=(
                f"Training run `{self.spec.name}` (`{' '.join(self.spec.command)}`) died {len(deaths)} times in a "
                f"row. Find the cause and fix it; the watchdog's evidence, side by side:\n\n"
                f"{deaths_side_by_side(deaths)}\n"
            ),
            approval=self.spec.approval,
            constraints=["do not restart the run yourself: the decider restarts it from its escalation"],
        )
        try:
            await workflow.start_child_workflow(
                HUNTING_TICKET_WORKFLOW,
                TicketInput(spec=spec, filed_by=self.spec.workflow_id, dispatch=self._hunting_dispatch(spec)),
                id=ticket_workflow_id(ticket_id),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=sa.at_start(spec),
                static_summary=start_summary(spec),
                static_details=start_details(spec),
            )
        except WorkflowAlreadyStartedError:
            workflow.logger.info("hunting ticket %s is already open", ticket_id)

    def _hunting_dispatch(self, spec: TicketSpec) -> DispatchRule | None:
        """Under the policy (the run has a rule), a hunting ticket's agent waits for a dispatch decision, which
        whoever the run's rule excluded may not give; with no policy, its spec's own approval decides."""
        if self.dispatch is None:
            return None
        return DispatchRule(
            required=True,
            excluded=self.dispatch.excluded,
            commands=tree_commands(spec),
            reason=f"a hunting agent for training run {self.spec.name} on {self.spec.host}",
        )

    async def _await_decision(self) -> None:
        reminders = self._notifies()
        waiting = Waiting(
            reminder=timedelta(seconds=self.spec.approval.reminder_interval_s) if reminders else None,
            interrupted=lambda: self.c.stop is not None,
            history_is_long=lambda: history_is_long(self.spec.history_limit),
            continue_as_new=self._continue_as_new,
        )
        answer = await self.desk.wait(TrainingEscalationOption, waiting)
        if answer is None or answer.option is TrainingEscalationOption.STOP:
            self.desk.withdraw()
            self._set(state=RunState.STOPPED)
            return
        # The decider restarts: the counter starts again, the next incarnation resumes from the checkpoint.
        self._set(death_counter=0, state=RunState.RESTARTING, incarnation=self.c.incarnation + 1)

    # ---- evaluations and deployments (EVALUATION_PATCH) ------------------------------------------------

    def _queue(self, checkpoints: list[str]) -> None:
        """Queue the complete checkpoints not seen before; past `max_waiting` besides the one being evaluated,
        the oldest waiting are skipped."""
        evaluation = self.spec.evaluation
        assert evaluation is not None
        known = {*self.c.seen, *self.c.waiting}
        new = [path for path in checkpoints if path not in known]
        if not new:
            return
        busy = self._evaluating_now
        rest = [path for path in [*self.c.waiting, *new] if path != busy]
        cut = max(0, len(rest) - evaluation.max_waiting)
        skipped, rest = rest[:cut], rest[cut:]
        self._set(
            waiting=[busy, *rest] if busy is not None else rest,
            skipped=[*self.c.skipped, *skipped][-SEEN_KEPT:],
            seen=[*self.c.seen, *skipped][-SEEN_KEPT:],
        )

    def _needed(self) -> list[str]:
        """Checkpoints the watchdog must not prune: waiting for their evaluation or a deployment decision, or the
        one deployed last."""
        if not self.evaluating:
            return []
        needed = list(self.c.waiting)
        for evaluation in (self.c.candidate, self.c.proposing):
            if evaluation is not None and evaluation.checkpoint not in needed:
                needed.append(evaluation.checkpoint)
        # The checkpoint the serving preset points to now: pruning it would break what serves.
        deployed = [d for d in self.c.deployments if d.outcome is DeploymentOutcome.DEPLOYED]
        if deployed and deployed[-1].checkpoint not in needed:
            needed.append(deployed[-1].checkpoint)
        return needed

    def _over(self) -> bool:
        """The run will take its evaluations no further: a stop was asked, or it ended other than finished."""
        return self.c.stop is not None or (self._run_over and self.c.state is not RunState.FINISHED)

    def _turn_due(self) -> bool:
        """Something for `_evaluation_turn` to act on: an evaluation ended, or a deployment was answered."""
        return (self._evaluation is not None and self._evaluation.done()) or self._deployment_answered

    async def _beside_the_segment(self, segment: workflow.ActivityHandle[SegmentReport]) -> None:
        """While the segment runs, act on evaluations and deployment answers as they come."""
        await self._evaluation_turn()
        while True:
            await workflow.wait_condition(lambda: segment.done() or self._turn_due())
            if segment.done():
                return
            await self._evaluation_turn()

    async def _evaluation_turn(self) -> None:
        """Record an evaluation that ended, act on a deployment's answer, start the next evaluation, and propose
        the best checkpoint that cleared the bar when the desk is free."""
        evaluation = self._evaluation
        if evaluation is not None and evaluation.done():
            checkpoint = self._evaluating_now
            assert checkpoint is not None
            self._evaluation, self._evaluating_now = None, None
            await self._record_evaluation(checkpoint, self._evaluated(evaluation))
        if self._deployment_answered:
            await self._take_answer()
        if self._over():
            return
        if self._evaluation is None and self.c.waiting:
            self._start_evaluation(self.c.waiting[0])
        if (
            (self.c.proposing is not None or self.c.candidate is not None)
            and self.desk.pending is None
            and self.c.state is not RunState.AWAITING_DECISION
        ):
            await self._propose()

    async def _finish_evaluations(self) -> None:
        """After the run: a finished run evaluates what is left and waits for its proposal's answer; a stopped
        one withdraws its proposal and drops its evaluation."""
        while not self._over():
            if self._evaluation is not None:
                await workflow.wait_condition(lambda: self._turn_due() or self._over())
                if self._over():
                    break
            await self._evaluation_turn()
            if self._evaluation is not None:
                continue
            pending = self.desk.pending
            if pending is not None and pending.kind is DecisionKind.DEPLOYMENT:
                # Nothing else left to do: wait for the answer, reminding as a ticket's decision is reminded.
                reminder = (
                    timedelta(seconds=self.spec.approval.reminder_interval_s) if self._notifies() else None
                )
                await self._take_answer(Waiting(reminder=reminder, interrupted=self._over))
                continue
            if not self.c.waiting and self.c.candidate is None and self.c.proposing is None:
                return
        if self._evaluation is not None:
            self._evaluation.cancel()
        self._set(waiting=[])
        await self._withdraw_proposal("the run ended before a decision")

    def _start_evaluation(self, checkpoint: str) -> None:
        evaluation = self.spec.evaluation
        assert evaluation is not None
        gate = evaluation.gate
        self._evaluating_now = checkpoint
        self._evaluation = EVALUATE_CHECKPOINT.start(
            EvaluationInput(
                spec=self.spec,
                checkpoint=checkpoint,
                filing=workflow.info().first_execution_run_id,
                lease=self.lease,
            ),
            task_queue=host_queue(self.spec.host),
            start_to_close_timeout=timedelta(seconds=gate.timeout_s + EVALUATION_ALLOWANCE_S),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=2)),
            summary=f"evaluate {checkpoint.rsplit('/', 1)[-1]}: {gate.describe()}",
        )

    def _evaluated(self, evaluation: workflow.ActivityHandle[CheckpointEvaluated]) -> CheckpointEvaluated:
        """The evaluation's answer; one that failed after its retries is an INVALID verdict saying why."""
        try:
            return evaluation.result()
        except (ActivityError, asyncio.CancelledError) as error:
            gate = self.spec.evaluation.gate if self.spec.evaluation is not None else None
            assert gate is not None
            return CheckpointEvaluated(
                result=GateResult(
                    gate=gate.name,
                    metric=gate.metric,
                    verdict=Verdict.INVALID,
                    reason=f"the evaluation step failed: {failed_step(error).message}"
                    if isinstance(error, ActivityError)
                    else "the evaluation step was cancelled",
                    rule=gate.describe(),
                    method="command",
                    host=self.spec.host,
                    gate_spec=gate,
                )
            )

    def _better(self, score: float, than: float | None) -> bool:
        evaluation = self.spec.evaluation
        assert evaluation is not None
        if than is None:
            return True
        higher = METRIC_DIRECTIONS[evaluation.gate.metric] is Direction.HIGHER_IS_BETTER
        return score > than if higher else score < than

    async def _record_evaluation(self, checkpoint: str, outcome: CheckpointEvaluated) -> None:
        evaluation = self.spec.evaluation
        assert evaluation is not None
        result = outcome.result
        baseline = median(result.baseline_samples) if result.baseline_samples else None
        evaluated = CheckpointEvaluation(
            checkpoint=checkpoint,
            step=outcome.step,
            verdict=result.verdict,
            rule=result.rule,
            reason=result.reason,
            score=median(result.samples),
            baseline=baseline,
            median=result.median,
            ci_low=result.ci_low,
            ci_high=result.ci_high,
            unit=result.unit,
            at=workflow.now(),
            skipped=self.c.skipped,
        )
        candidate = self.c.candidate
        if evaluation.deploy is not None and evaluated.clears and evaluated.score is not None:
            best = self.c.proposed_best
            for earlier in (candidate, self.c.proposing):
                if earlier is not None and earlier.score is not None and self._better(earlier.score, best):
                    best = earlier.score
            if self._better(evaluated.score, best):
                candidate = evaluated
        self._set(
            evaluations=[*self.c.evaluations, evaluated][-EVALUATIONS_KEPT:],
            waiting=[path for path in self.c.waiting if path != checkpoint],
            seen=[*self.c.seen, checkpoint][-SEEN_KEPT:],
            skipped=[],
            candidate=candidate,
        )
        report = self.c.last_report
        detail = {
            "checkpoint": checkpoint,
            "verdict": result.verdict.value,
            "rule": result.rule,
            **({"step": str(outcome.step)} if outcome.step is not None else {}),
            **({"score": f"{evaluated.score:.6g}"} if evaluated.score is not None else {}),
            **({"baseline": f"{baseline:.6g}"} if baseline is not None else {}),
            **({"skipped": ", ".join(evaluated.skipped)} if evaluated.skipped else {}),
            **{f"trainer_{k}": v for k, v in progress_detail(report.progress if report else None).items()},
        }
        await self.trail.record(
            AuditKind.EVALUATION,
            f"evaluated {evaluated.summary()}" + ("" if evaluated.clears else f": {result.reason}"),
            detail=detail,
            gate_results=[result],
        )

    async def _propose(self) -> None:
        """Ask the deciders about the best checkpoint that cleared the bar; the run goes on meanwhile."""
        deploy = self._deploy_policy()
        if self.c.proposing is None:
            self._set(proposing=self.c.candidate, candidate=None)
        proposing = self.c.proposing
        assert proposing is not None
        value = deploy.filled(checkpoint=proposing.checkpoint, step=proposing.step, run=self.spec.name)
        question = (
            f"Training run {self.spec.name}'s {proposing.name} cleared its evaluation: {proposing.summary()}. "
            f"Switch {deploy.preset} in {deploy.repo} ({deploy.key}) to it?"
        )
        evidence = [
            proposing.summary(),
            f"{deploy.key} := {value}",
            f"commit in {deploy.repo} on host {deploy.host or self.spec.host}"
            + (f", branch {deploy.branch}" if deploy.branch else ""),
        ]
        self._deployment_answered = False
        await self.desk.request(
            DecisionKind.DEPLOYMENT, question, DeploymentOption, evidence, ticket_id=self.spec.workflow_id
        )

    async def _take_answer(self, waiting: Waiting | None = None) -> None:
        """Record the deployment's answer (the desk has it) and act on it: skip, or the host's commit."""
        self._deployment_answered = False
        answer = await self.desk.wait(
            DeploymentOption, waiting or Waiting(reminder=None, interrupted=self._over)
        )
        proposing = self.c.proposing
        if answer is None or proposing is None:
            return
        if answer.option is DeploymentOption.SKIP:
            await self._record_deployment(
                proposing,
                DeploymentOutcome.SKIPPED,
                f"{answer.by} chose not to deploy it",
                answer.decision.decided_by,
                request_id=answer.decision.request_id,
            )
        else:
            await self._deploy(proposing, answer.decision.request_id, answer.decision.decided_by)
        best = self.c.proposed_best
        if proposing.score is not None and self._better(proposing.score, best):
            best = proposing.score
        self._set(proposing=None, proposed_best=best)

    async def _deploy(self, proposing: CheckpointEvaluation, request_id: str, decided_by: str) -> None:
        deploy = self._deploy_policy()
        done = await self.steps.on_host(
            DEPLOY_CHECKPOINT,
            DeploymentInput(
                run=self.spec.name,
                policy=deploy,
                checkpoint=proposing.checkpoint,
                step=proposing.step,
                request_id=request_id,
                decided_by=decided_by,
                evaluation=proposing.summary(),
            ),
            host=deploy.host or self.spec.host,
            timeout=DEPLOY_TIMEOUT,
            heartbeat=None,
            interruptible=False,
            summary=f"deploy {proposing.name} to {deploy.preset}",
        )
        if isinstance(done, StepFailed):
            await self._record_deployment(
                proposing,
                DeploymentOutcome.FAILED,
                f"approved by {decided_by}, but the commit failed: {done.message}",
                decided_by,
                request_id=request_id,
            )
            return
        await self._record_deployment(
            proposing,
            DeploymentOutcome.DEPLOYED,
            f"{deploy.preset} {deploy.key}: {done.previous!r} -> {done.value!r}, commit {done.commit[:12]}"
            + (" (made by an earlier try)" if done.already else ""),
            decided_by,
            request_id=request_id,
            commit=done.commit,
            value=done.value,
            previous=done.previous,
        )

    async def _withdraw_proposal(self, why: str, *, keep: bool = False) -> None:
        """Withdraw the pending deployment request (the store marks it so); `keep`: propose it again later."""
        pending = self.desk.pending
        request = pending.id if pending is not None and pending.kind is DecisionKind.DEPLOYMENT else None
        if request is not None:
            self.desk.withdraw()
        proposing = self.c.proposing
        if proposing is None or (keep and request is None):
            return
        if not keep:
            self._set(proposing=None)
        await self._record_deployment(proposing, DeploymentOutcome.WITHDRAWN, why, withdrawn=request)

    def _deploy_policy(self) -> DeploymentPolicy:
        evaluation = self.spec.evaluation
        assert evaluation is not None and evaluation.deploy is not None
        return evaluation.deploy

    async def _record_deployment(
        self,
        evaluated: CheckpointEvaluation,
        outcome: DeploymentOutcome,
        summary: str,
        decided_by: str | None = None,
        *,
        request_id: str | None = None,
        commit: str | None = None,
        value: str | None = None,
        previous: str | None = None,
        withdrawn: str | None = None,
    ) -> None:
        deploy = self._deploy_policy()
        deployment = Deployment(
            checkpoint=evaluated.checkpoint,
            step=evaluated.step,
            score=evaluated.score,
            request_id=request_id or withdrawn,
            outcome=outcome,
            decided_by=decided_by.split(":")[0] if decided_by else None,
            commit=commit,
            repo=str(deploy.repo),
            preset=deploy.preset,
            key=deploy.key,
            value=value,
            previous=previous,
            at=workflow.now(),
            summary=summary,
        )
        self._set(deployments=[*self.c.deployments, deployment][-EVALUATIONS_KEPT:])
        detail = {
            "checkpoint": evaluated.checkpoint,
            "outcome": outcome.value,
            "repo": str(deploy.repo),
            "preset": deploy.preset,
            "key": deploy.key,
            **({"step": str(evaluated.step)} if evaluated.step is not None else {}),
            **({"request": request_id} if request_id else {}),
            **({"commit": commit} if commit else {}),
            **({"value": value} if value is not None else {}),
            **({"previous": previous} if previous is not None else {}),
            **({WITHDRAWS_REQUEST: withdrawn, "request": withdrawn} if withdrawn is not None else {}),
        }
        await self.trail.record(
            AuditKind.DEPLOYMENT,
            f"{evaluated.name} {outcome.value}: {summary}",
            actor=deployment.decided_by or "daedalus",
            detail=detail,
        )
