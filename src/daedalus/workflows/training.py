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
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from daedalus.errors import TrainingInputError
    from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord
    from daedalus.schemas.ticket import (
        AgentSpec,
        Decision,
        DecisionKind,
        DecisionRequest,
        TicketInput,
        TicketKind,
        TicketSpec,
    )
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
        TrainingCarry,
        TrainingRunInput,
        TrainingRunSpec,
        TrainingRunStatus,
    )

SUPERVISE_ACTIVITY = "supervise_training"
HOST_REPORT_ACTIVITY = "training_host_report"
TICKET_WORKFLOW = "TicketWorkflow"
AUDIT_ACTIVITY = "record_audit_event"
AUDIT_TIMEOUT = timedelta(seconds=30)
AUDIT_PATCH = "training-audit-events"
"""Histories recorded before runs wrote audit events replay without them (tests/histories/training-v1-*)."""
LAUNCH_ALLOWANCE_S = 60.0
ENDED = (RunState.STOPPED, RunState.FINISHED, RunState.GAVE_UP)


class EscalationOption:
    RESTART = "restart"
    STOP = "stop"
    OPTIONS = [RESTART, STOP]


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
        self.c: TrainingCarry = inp.carry
        self.answer: Decision | None = None
        self.segment: workflow.ActivityHandle[SegmentReport] | None = None

    # ---- queries, updates, signals --------------------------------------------------------------------

    @workflow.query
    def status(self) -> TrainingRunStatus:
        report = self.c.last_report
        return TrainingRunStatus(
            name=self.spec.name,
            host=self.spec.host,
            state=self.c.state,
            incarnation=self.c.incarnation,
            memory_now=report.memory_now if report else None,
            slope_gib_per_h=report.slope_gib_per_h if report else None,
            leak_flagged=report.leak_flagged if report else False,
            last_checkpoint=report.last_checkpoint if report else None,
            trainer_pid=report.trainer_pid if report and report.death is None else None,
            deaths=self.c.deaths,
            death_counter=self.c.death_counter,
            hunting_tickets=self.c.hunting_tickets,
            pending_decision=self.c.pending_decision,
            host_report=self.c.host_report,
            continued=self.c.continued,
        )

    @workflow.update
    def decide(self, decision: Decision) -> TrainingRunStatus:
        """Answer the pending escalation; the validator has checked id, option and authority."""
        self.answer = decision
        return self.status()

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        request = self.c.pending_decision
        if request is None or self.answer is not None:
            raise ValueError(
                f"training run {self.spec.name} is not waiting for a decision ({self.c.state.value})"
            )
        refusal = request.refusal(decision, f"run {self.spec.name}")
        if refusal is not None:
            raise ValueError(refusal)

    @workflow.update
    def stop(self, request: StopTraining) -> TrainingRunStatus:
        """Stop the run gracefully (checkpoint signal first); the current segment is cancelled at once."""
        self.c = self.c.model_copy(update={"stop": request})
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
        if self.c.host_report is None:
            self._set(host_report=await self._host_report())
        try:
            await self._live()
        except ApplicationError as err:
            if self.c.state is RunState.GAVE_UP:
                await self._audit(AuditKind.CLOSED, f"gave up: {err.message}")
            raise
        await self._audit(AuditKind.CLOSED, self._ending(), actor=self._ended_by())
        return self.status()

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
            if self._history_is_long():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    TrainingRunInput(
                        spec=self.spec, carry=self.c.model_copy(update={"continued": self.c.continued + 1})
                    )
                )

    def _set(self, **changes: object) -> None:
        self.c = self.c.model_copy(update=changes)

    # ---- audit ---------------------------------------------------------------------------------------

    async def _audit(
        self,
        kind: AuditKind,
        summary: str,
        *,
        actor: str = "daedalus",
        detail: dict[str, str] | None = None,
        decision_request: DecisionRequest | None = None,
        decision: Decision | None = None,
    ) -> None:
        """Write one transition. The seq is taken before the await, so concurrent handlers never share one."""
        if not workflow.patched(AUDIT_PATCH):
            return
        seq = self.c.audit_seq + 1
        self._set(audit_seq=seq)
        info = workflow.info()
        record = AuditRecord(
            event=AuditEvent(
                workflow_id=info.workflow_id,
                run_id=info.first_execution_run_id,
                seq=seq,
                ticket_id=self.spec.workflow_id,
                kind=kind,
                actor=actor.lower(),
                at=workflow.now(),
                status=self.c.state.value,
                summary=summary,
                detail=detail or {},
            ),
            decision_request=decision_request,
            decision=decision,
        )
        await workflow.execute_activity(
            AUDIT_ACTIVITY, record, result_type=bool, start_to_close_timeout=AUDIT_TIMEOUT
        )

    async def _audit_start(self, verb: str) -> None:
        resume = self._resume_from()
        detail = {"incarnation": str(self.c.incarnation), "host": self.spec.host}
        if resume:
            detail["resume_from"] = resume
        if self.c.host_report is not None:
            detail["host_report"] = self.c.host_report.summary()
        await self._audit(
            AuditKind.TRAINING,
            f"{verb} incarnation {self.c.incarnation} on {self.spec.host}"
            + (f", resuming from {resume}" if resume else ""),
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
        await self._audit(
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
        if (
            state is RunState.STOPPED
            and self.c.decisions
            and self.c.decisions[-1].option == EscalationOption.STOP
        ):
            return (
                f"stopped by {self.c.decisions[-1].decided_by}'s decision after {len(self.c.deaths)} deaths"
            )
        cause = f" after {last.id}: {last.summary}" if last is not None else ""
        return f"{state.value}{cause}"

    def _ended_by(self) -> str:
        if self.c.stop is not None:
            return self.c.stop.requested_by
        last = self.c.decisions[-1] if self.c.decisions else None
        if self.c.state is RunState.STOPPED and last is not None and last.option == EscalationOption.STOP:
            return last.decided_by
        return "daedalus"

    def _history_is_long(self) -> bool:
        info = workflow.info()
        return (
            info.get_current_history_length() >= self.spec.history_limit
            or info.is_continue_as_new_suggested()
        )

    async def _host_report(self) -> HostReport | None:
        try:
            return await workflow.execute_activity(
                HOST_REPORT_ACTIVITY,
                HostReportInput(host=self.spec.host),
                result_type=HostReport,
                task_queue=f"host-{self.spec.host}",
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except ActivityError as err:
            workflow.logger.warning("host report failed for %s: %s", self.spec.name, err)
            return None

    async def _supervise(self) -> SegmentReport:
        policy = self.spec.watchdog
        inp = SuperviseInput(
            spec=self.spec,
            incarnation=self.c.incarnation,
            stop_requested=self.c.stop is not None,
            resume_from=self._resume_from(),
            filing=workflow.info().first_execution_run_id,
        )
        budget = (
            policy.report_interval_s + policy.checkpoint_grace_s + policy.term_grace_s + LAUNCH_ALLOWANCE_S
        )
        while True:
            self.segment = workflow.start_activity(
                SUPERVISE_ACTIVITY,
                inp,
                result_type=SegmentReport,
                task_queue=f"host-{self.spec.host}",
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
                inp = inp.model_copy(update={"stop_requested": True})
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
                inp = inp.model_copy(update={"stop_requested": True})
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
            await self._audit(
                AuditKind.HUNT,
                f"opened hunting ticket {ticket_id} for {self.spec.hunt.agent.value} after {len(counted)} deaths",
                detail={
                    "ticket": ticket_id,
                    "workflow_id": f"ticket-{ticket_id}",
                    "deaths": ", ".join(d.id for d in counted),
                },
            )
        request = DecisionRequest(
            id=f"{self.spec.workflow_id}-escalation-{number}",
            ticket_id=ticket_id,
            kind=DecisionKind.ESCALATION,
            question=(
                f"Training run {self.spec.name} died {len(counted)} times; hunting ticket {ticket_id} is open. "
                f"Restart from the last checkpoint, or stop the run?"
            ),
            options=EscalationOption.OPTIONS,
            evidence=[f"{d.id}: {d.death_class.value}: {d.summary} ({d.curve_path})" for d in counted],
            deciders=self.spec.approval.deciders,
            delegates=self.spec.approval.delegates.get(DecisionKind.ESCALATION.value, []),
            requested_at=workflow.now(),
        )
        self._set(escalations=number, pending_decision=request, state=RunState.AWAITING_DECISION)
        await self._audit(
            AuditKind.DECISION_REQUESTED,
            f"asked {', '.join(sorted({*request.deciders, *request.delegates}))}: {request.question}",
            decision_request=request,
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
                TICKET_WORKFLOW,
                TicketInput(spec=spec, filed_by=self.spec.workflow_id),
                id=f"ticket-{ticket_id}",
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            workflow.logger.info("hunting ticket %s is already open", ticket_id)

    async def _await_decision(self) -> None:
        await workflow.wait_condition(lambda: self.answer is not None or self.c.stop is not None)
        answer = self.answer
        self.answer = None
        decisions = [*self.c.decisions, answer] if answer else self.c.decisions
        request = self.c.pending_decision
        self._set(decisions=decisions, pending_decision=None)
        if answer is not None and request is not None:
            await self._audit(
                AuditKind.DECIDED,
                f"{answer.decided_by} chose {answer.option!r} for {request.id} via {answer.channel}",
                actor=answer.decided_by,
                decision=answer,
                detail={"request": request.id, "option": answer.option, "channel": answer.channel},
            )
        if answer is None or answer.option == EscalationOption.STOP:
            self._set(state=RunState.STOPPED)
            return
        # The decider restarts: the counter starts again, the next incarnation resumes from the checkpoint.
        self._set(death_counter=0, state=RunState.RESTARTING, incarnation=self.c.incarnation + 1)
