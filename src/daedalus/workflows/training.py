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
    from daedalus.activities.refs import SUPERVISE_TRAINING, TRAINING_HOST_REPORT
    from daedalus.decisions.desk import DecisionDesk, Waiting
    from daedalus.decisions.schemas import (
        Decision,
        DecisionKind,
        Delegation,
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
    from daedalus.schemas.audit import AuditKind, TrailState
    from daedalus.schemas.gates import LeaseRecord
    from daedalus.schemas.ticket import AgentSpec, TicketInput, TicketKind, TicketSpec
    from daedalus.schemas.training import (
        COUNTED_DEATHS,
        Death,
        DeathClass,
        HostReport,
        HostReportInput,
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
    from daedalus.workflows.steps import StepFailed, Steps, history_is_long
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
        )

    @workflow.update
    def decide(self, decision: Decision) -> TrainingRunStatus:
        """Answer the pending escalation; the validator has checked id, option and authority."""
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
        if self.c.state in ENDED:
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
            if report.death is not None:
                if self._record_death(report.death):
                    await self._audit_death(report.death)
                if await self._after_death(report.death):
                    return
            if history_is_long(self.spec.history_limit):
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
