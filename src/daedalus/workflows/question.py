"""QuestionWorkflow (`question-<id>`): a question for the deciders that belongs to no ticket.

It asks once through the decision desk (audit trail `question:<id>`, Slack, reminders, the authority check),
then waits for an answer, its deadline or its withdrawal, whichever comes first. An answer with the option that
enacts the question's rule is recorded as a `ruled` event carrying the `Ruling` (who ruled, when): the standing
rulings are those events in the store. At the deadline the question closes as expired, with the outcome its
filer set (`on_deadline`) or none.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from enum import StrEnum

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from daedalus.decisions.desk import DecisionDesk, Waiting
    from daedalus.decisions.questions import (
        RULING_DETAIL,
        QuestionInput,
        QuestionState,
        QuestionStatus,
        WithdrawQuestion,
    )
    from daedalus.decisions.rulings import Ruling, describe
    from daedalus.decisions.schemas import (
        Decision,
        DecisionKind,
        DecisionRequest,
        DeskState,
        QuestionSubject,
    )
    from daedalus.schemas.audit import AuditKind
    from daedalus.workflows.trail import AuditTrail


@workflow.defn
class QuestionWorkflow:
    @workflow.init
    def __init__(self, request: QuestionInput) -> None:
        self.spec = request.spec
        self.asked_by = request.asked_by
        self.deciders = list(request.deciders)
        self.state = QuestionState.OPEN
        self.expired = False
        self.withdrawal: WithdrawQuestion | None = None
        self.outcome: str | None = None
        self.decided_by: str | None = None
        self.note = ""
        self.ruling: Ruling | None = None
        self.subject = QuestionSubject(question=self.spec.id)
        self.trail: AuditTrail[QuestionStatus] = AuditTrail(
            self.subject.audit_key, status=lambda: self.state.value, view=lambda seq: self._now()
        )
        self.desk = DecisionDesk(
            self.subject, self.spec.id, self.trail, DeskState(), deciders=lambda: self.deciders
        )
        self.trail.begin()

    def _now(self) -> QuestionStatus:
        return QuestionStatus(
            question_id=self.spec.id,
            question=self.spec.question,
            status=self.state,
            asked_by=self.asked_by,
            deadline=self.spec.deadline,
            pending_decision=self.desk.pending,
            outcome=self.outcome,
            decided_by=self.decided_by,
            note=self.note,
            ruling=self.ruling,
        )

    @workflow.query
    def status(self) -> QuestionStatus:
        """The question as the store holds it (a pending request only once its audit event is written)."""
        return self.trail.written

    @workflow.query
    def pending_decision(self) -> DecisionRequest | None:
        """The request awaiting an answer, for the service layer's authority policy."""
        return self.desk.pending

    @workflow.update
    def decide(self, decision: Decision) -> QuestionStatus:
        """Answer the question; the validator has checked the request id, the option and the decider."""
        self.desk.answer(decision)
        return self.status()

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        if self.expired:
            raise ValueError(f"question {self.spec.id} passed its deadline and takes no answer")
        self.desk.validate(decision, self.state.value)

    @workflow.update
    def withdraw(self, request: WithdrawQuestion) -> QuestionStatus:
        """Its asker or a decider withdraws the question; the close records who and why."""
        self.withdrawal = request
        return self.status()

    @withdraw.validator
    def _validate_withdraw(self, request: WithdrawQuestion) -> None:
        if self.state.is_closed or self.withdrawal is not None or self.desk.pending is None:
            raise ValueError(f"question {self.spec.id} is not open (status: {self.state.value})")
        allowed = sorted({self.asked_by, *self.deciders})
        if request.requested_by.lower() not in allowed:
            raise ValueError(
                f"{request.requested_by} may not withdraw question {self.spec.id}; allowed: its asker and "
                f"deciders: {allowed}"
            )

    @workflow.run
    async def run(self, request: QuestionInput) -> QuestionStatus:
        spec = self.spec
        await self.trail.record(
            AuditKind.FILED,
            f"{self.asked_by} asked {', '.join(self.deciders)}: {spec.question}",
            actor=self.asked_by,
            detail={"subject": self.subject.model_dump_json(), "deadline": spec.deadline.isoformat()},
        )
        options = StrEnum("QuestionOption", {option: option for option in spec.options})  # type: ignore[misc]
        deadline = asyncio.create_task(self._deadline())
        evidence = [*([spec.detail] if spec.detail else []), *spec.evidence]
        if spec.rule is not None:
            evidence.append(f"answering {spec.enacts!r} makes a standing ruling: {spec.rule.describe()}")
        if spec.revokes:
            evidence.append(f"answering {spec.enacts!r} lifts the standing rulings {', '.join(spec.revokes)}")
        evidence.append(
            f"deadline {spec.deadline:%Y-%m-%d %H:%M} UTC; then "
            + (f"{spec.on_deadline!r} is recorded" if spec.on_deadline else "it expires unanswered")
        )
        reminder = spec.reminder_interval_s
        answer = await self.desk.ask(
            DecisionKind.QUESTION,
            spec.question,
            options,
            evidence,
            Waiting(
                reminder=timedelta(seconds=reminder) if reminder else None,
                interrupted=lambda: self.expired or self.withdrawal is not None,
            ),
            ticket_id=self.subject.audit_key,
        )
        deadline.cancel()
        if answer is None:
            self.desk.withdraw()
            return await self._close_unanswered()
        decision = answer.decision
        self.outcome, self.decided_by, self.note = decision.option, decision.decided_by, decision.note
        if spec.enacts is not None and decision.option == spec.enacts:
            self.ruling = Ruling(
                id=spec.id,
                statement=spec.statement or spec.question,
                rule=spec.rule,
                revokes=list(spec.revokes),
                ruled_by=decision.decided_by,
                ruled_at=workflow.now(),
                note=decision.note,
            )
            self.state = QuestionState.RULED
            await self.trail.record(
                AuditKind.RULED,
                f"{decision.decided_by} ruled: {self.ruling.statement} ({describe(self.ruling)})",
                actor=decision.decided_by,
                detail={RULING_DETAIL: self.ruling.model_dump_json()},
            )
        else:
            self.state = QuestionState.ANSWERED
        await self.trail.record(
            AuditKind.CLOSED,
            f"{decision.decided_by} answered {decision.option!r}"
            + (f": {decision.note}" if decision.note else ""),
            actor=decision.decided_by,
            detail={"outcome": decision.option},
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    async def _deadline(self) -> None:
        await asyncio.sleep(max((self.spec.deadline - workflow.now()).total_seconds(), 0.0))
        self.expired = True

    async def _close_unanswered(self) -> QuestionStatus:
        withdrawal = self.withdrawal
        if withdrawal is not None:
            self.state = QuestionState.WITHDRAWN
            await self.trail.record(
                AuditKind.CLOSED,
                f"withdrawn by {withdrawal.requested_by}: {withdrawal.reason}",
                actor=withdrawal.requested_by,
                detail={"withdrawn": withdrawal.reason},
            )
        else:
            self.state = QuestionState.EXPIRED
            self.outcome = self.spec.on_deadline
            recorded = f"; recorded outcome {self.outcome!r}" if self.outcome else "; no outcome recorded"
            await self.trail.record(
                AuditKind.CLOSED,
                f"deadline {self.spec.deadline:%Y-%m-%d %H:%M} UTC passed unanswered{recorded}",
                detail={"expired": "true", **({"outcome": self.outcome} if self.outcome else {})},
            )
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()
