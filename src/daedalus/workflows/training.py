"""TrainingRunWorkflow: one training run (id `training-<name>`), supervised incarnation after incarnation.

The watchdog runs on the host as a sequence of short `supervise_training` activities; each one starts or
re-attaches to the current incarnation and reports memory, slope and checkpoint, or the incarnation's death.
Deaths are recorded once per id. The third counted death escalates to the decider and opens one hunting
ticket (training/hunt.py), whose deterministic id (and REJECT_DUPLICATE) keeps a replay, a duplicated report or
a restarted worker from opening a second.

Every transition (started/restarted, each death, hunting ticket opened, escalation requested, decision, ended)
is one audit event with subject `training-<name>`, written by `record_audit_event` on the workflow's own
(control) queue and idempotent on (first run id, seq); the seq counter travels in the carry across
continue-as-new, because the first run id stays the same along the chain.

What a death means, what is queued, proposed and recorded: workflows/training_rules.py (pure). The steps
outside the run (GPU lease, host report, supervise segment, hunting ticket): workflows/training_steps.py.
Checkpoint evaluations and deployments (patch `EVALUATION_PATCH`): workflows/training_evaluation.py.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import NoReturn

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
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
    from daedalus.schemas.audit import AuditKind, TrailState
    from daedalus.schemas.gates import LeaseRecord
    from daedalus.schemas.training import (
        Death,
        RunState,
        SegmentReport,
        StopTraining,
        TrainingRunInput,
        TrainingRunSpec,
        TrainingRunStatus,
    )
    from daedalus.workflows import training_rules as rules
    from daedalus.workflows import training_steps as steps
    from daedalus.workflows.patches import PatchesAtStart
    from daedalus.workflows.steps import Steps, history_is_long
    from daedalus.workflows.trail import AuditTrail
    from daedalus.workflows.training_evaluation import CheckpointEvaluations

AUDIT_PATCH = "training-audit-events"
"""Histories recorded before runs wrote audit events replay without them (tests/histories/training-v1-*)."""
DESK_PATCH = "training-decision-desk"
"""Escalations posted to Slack and reminded, as a ticket's are; histories recorded before (training-escalation,
training-reattach) replay without the notifications and reminders. Asked lazily, at the first notification, by
runs started before `DESK_AT_START_PATCH`; never asked by runs started after it."""
DESK_AT_START_PATCH = "training-decision-desk-at-start"
"""The desk is on, decided in the run's first activation (workflows/patches.py says why: `DESK_PATCH` was asked
first right after an audit write, a local activity)."""


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
            notify=self.notifies,
        )
        self.steps = Steps(lambda: False)
        self.gpus = inp.gpus
        self.lease: LeaseRecord | None = None
        self.evaluations = CheckpointEvaluations(self)
        self.trail.begin()

    # ---- queries, updates, signals --------------------------------------------------------------------

    @workflow.query
    def status(self) -> TrainingRunStatus:
        """The run as its audit trail in the store shows it: its state and pending decision never run ahead
        of the writes (memory, slope and checkpoint are the watchdog's latest report)."""
        return rules.status(self.spec, self.c, self.trail.written, self.trail.written_seq, self.started_by)

    @workflow.update
    def decide(self, decision: Decision) -> TrainingRunStatus:
        """Answer the pending request; the validator has checked id, option and authority."""
        pending = self.desk.pending
        if pending is not None and pending.kind is DecisionKind.DEPLOYMENT:
            self.evaluations.answered = True  # the run's loop acts on it between its steps
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
        finishing = self.evaluations.run_over and self.evaluations.on and self.c.stop is None
        if self.c.state in rules.ENDED and not finishing:
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
        self.evaluations.ask_patch()
        if inp.dispatch is not None and inp.dispatch.required and not await self._dispatched(inp.dispatch):
            await self._close()
            return self.status()
        if self.c.host_report is None:
            self._set(host_report=await steps.host_report(self.steps, self.spec))
        async with steps.holding_gpus(self.spec, self.gpus) as self.lease:
            try:
                await self._live()
            except ApplicationError as err:
                if self.c.state is RunState.GAVE_UP:
                    await self.trail.record(AuditKind.CLOSED, f"gave up: {err.message}")
                raise
            if self.evaluations.on:  # a finished run evaluates what is left and waits for its proposal
                await self.evaluations.finish()
        await self._close()
        return self.status()

    async def _close(self) -> None:
        decisions = self.desk.state.decisions
        closing, actor = rules.ending(self.c, decisions), rules.ended_by(self.c, decisions)
        await self.trail.record(AuditKind.CLOSED, closing, actor=actor)

    async def _dispatched(self, rule: DispatchRule) -> bool:
        """The server's policy requires a dispatch decision before anything runs on the host (the starter does
        not operate it): ask, and wait. False when it was rejected or the run was stopped while waiting.
        Only a first run asks: its continuation's input carries the rule no longer required (`_continue_as_new`)."""
        answer = await self.desk.ask(
            DecisionKind.DISPATCH,
            f"Start training run {self.spec.name} on {self.spec.host}? ({rule.reason})",
            DispatchOption,
            [f"runs {line}" for line in rule.commands],
            self._waiting(reminders=True),
            ticket_id=self.spec.workflow_id,
            before_write=lambda request: self._set(state=RunState.AWAITING_DECISION),
            excluded=rule.excluded,
        )
        if answer is None or answer.option is DispatchOption.REJECT:
            self.desk.withdraw()
            if answer is not None:
                by = answer.decision.decided_by
                self._set(stop=StopTraining(requested_by=by, reason="dispatch rejected"))
            self._set(state=RunState.STOPPED)
            return False
        self._set(state=RunState.STARTING)
        return True

    def _waiting(self, *, reminders: bool, continues: bool = False) -> Waiting:
        """How the run waits for an answer: reminded (or not) until a stop; continued as new when asked to."""
        limit = self.spec.history_limit
        return Waiting(
            reminder=timedelta(seconds=self.spec.approval.reminder_interval_s) if reminders else None,
            interrupted=lambda: self.c.stop is not None,
            history_is_long=(lambda: history_is_long(limit)) if continues else (lambda: False),
            continue_as_new=self._continue_as_new if continues else None,
        )

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
            report = await steps.supervise(self)
            self._set(last_report=report)
            if self.evaluations.on:
                self.evaluations.queue(report.checkpoints)
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
        carry = self.c.changed(
            continued=self.c.continued + 1,
            desk=self.desk.state,
            trail=self.trail.carry(),
            pending_decision=None,
            decisions=[],
            audit_seq=0,
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

    def notifies(self) -> bool:
        """Whether requests are posted and reminded."""
        return self.patches.patched(DESK_PATCH)

    async def _audit_start(self, verb: str) -> None:
        resume = rules.resume_from(self.c)
        await self.trail.record(
            AuditKind.TRAINING,
            f"{verb} incarnation {self.c.incarnation} on {self.spec.host}"
            + (f", resuming from {resume}" if resume else ""),
            actor=self.started_by if verb == "started" else "daedalus",
            detail=rules.start_detail(self.c, self.spec.host),
        )

    async def _audit_death(self, death: Death, actor: str = "watchdog") -> None:
        await self.trail.record(
            AuditKind.DEATH,
            f"{death.id} died: {death.death_class.value}: {death.summary}",
            actor=actor,
            detail=rules.death_detail(death, self.c.death_counter),
        )

    def _record_death(self, death: Death) -> bool:
        """Record a death once; True when it was new."""
        recorded = rules.with_death(self.c, death, self.spec.restart)
        if recorded is None:
            return False
        self.c = recorded
        workflow.logger.info(
            "run %s: death %s (%s), counter %d",
            self.spec.name,
            death.id,
            death.death_class,
            recorded.death_counter,
        )
        return True

    async def _after_death(self, death: Death) -> bool:
        """Restart, escalate or end after the current incarnation's death; True when the run is over."""
        after = rules.after_death(self.c, death, self.spec.restart)
        if after is rules.AfterDeath.ESCALATE:
            await steps.escalate(self)
        elif after is rules.AfterDeath.RESTART:
            self._set(state=RunState.RESTARTING)
            if self.spec.restart.restart_delay_s > 0:
                with contextlib.suppress(TimeoutError):  # the delay ran out: restart
                    await workflow.wait_condition(
                        lambda: self.c.stop is not None,
                        timeout=timedelta(seconds=self.spec.restart.restart_delay_s),
                    )
            self._set(incarnation=self.c.incarnation + 1)
        elif after.ends is not None:
            self._set(state=after.ends)
            return True
        return False

    async def _await_decision(self) -> None:
        answer = await self.desk.wait(
            TrainingEscalationOption, self._waiting(reminders=self.notifies(), continues=True)
        )
        if answer is None or answer.option is TrainingEscalationOption.STOP:
            self.desk.withdraw()
            self._set(state=RunState.STOPPED)
            return
        # The decider restarts: the counter starts again, the next incarnation resumes from the checkpoint.
        self._set(death_counter=0, state=RunState.RESTARTING, incarnation=self.c.incarnation + 1)
