"""The decision desk: the workflow side of asking people things, shared by every workflow by composition.

A workflow owns one `DecisionDesk` and routes its `decide` (and `delegate`) updates to it. The desk asks
(writes the request to the audit trail, posts it to Slack), validates answers before anything is written,
reminds on an interval, records the answer, and withdraws a request its subject no longer needs. Its state is
one model, carried across continue-as-new; a long wait continues as new at a reminder, so a decision that waits
a month keeps a bounded history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Generic, NoReturn, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import NOTIFY_DECISION_REQUEST
    from daedalus.decisions.authority import refusal
    from daedalus.decisions.schemas import (
        Decision,
        DecisionKind,
        DecisionRequest,
        DecisionSubject,
        Delegation,
        DeskState,
    )
    from daedalus.errors import BrokenInvariant
    from daedalus.schemas.audit import AuditKind
    from daedalus.workflows.trail import AuditTrail

E = TypeVar("E", bound=StrEnum)
NOTIFY_TIMEOUT = timedelta(seconds=30)
NOTIFY_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=2))


@dataclass(frozen=True)
class Answer(Generic[E]):
    """A validated answer: the option as a member of the question's enum, and the decision as given."""

    option: E
    decision: Decision

    @property
    def by(self) -> str:
        """Who decided, with their note: for outcome reasons."""
        note = self.decision.note
        return self.decision.decided_by + (f": {note}" if note else "")


@dataclass
class Waiting:
    """How the desk waits: remind every `reminder` (None: never), stop waiting when `interrupted` is true,
    and continue as new at a reminder when `history_is_long`."""

    reminder: timedelta | None
    interrupted: Callable[[], bool]
    history_is_long: Callable[[], bool] = lambda: False
    continue_as_new: Callable[[], NoReturn] | None = None


class DecisionDesk:
    def __init__(
        self,
        subject: DecisionSubject,
        prefix: str,
        trail: AuditTrail,
        state: DeskState,
        *,
        deciders: Callable[[], list[str]],
        notify: Callable[[], bool] = lambda: True,
    ) -> None:
        """`prefix` starts every request id (`<prefix>-<kind>-<n>`); ids are names, never parsed."""
        self.subject = subject
        self.prefix = prefix
        self.trail = trail
        self.state = state
        self._deciders = deciders
        self._notify_on = notify
        self._answer: Decision | None = None

    # ---- what the updates call -----------------------------------------------------------------------

    @property
    def pending(self) -> DecisionRequest | None:
        return self.state.pending

    def validate(self, decision: Decision, subject_state: str) -> None:
        """The `decide` validator: a refusal is raised before anything is written."""
        request = self.state.pending
        if request is None or self._answer is not None:
            raise ValueError(f"{self.subject.label} is not waiting for a decision (status: {subject_state})")
        why = refusal(request, decision)
        if why is not None:
            raise ValueError(why)

    def answer(self, decision: Decision) -> None:
        """The `decide` update itself (after `validate`): the waiting `ask` picks it up."""
        self._answer = decision

    def validate_delegation(self, delegation: Delegation) -> None:
        """A decider may delegate, unless the pending request of that kind excludes them: a filer cannot hand
        their own dispatch to someone else."""
        if delegation.granted_by not in self._deciders():
            raise ValueError(
                f"{delegation.granted_by} is not a decider of {self.subject.label} and cannot delegate; "
                f"deciders: {self._deciders()}"
            )
        pending = self.state.pending
        if (
            pending is not None
            and pending.kind is delegation.kind
            and delegation.granted_by in pending.excluded
        ):
            raise ValueError(
                f"{delegation.granted_by} filed {self.subject.label} and may not decide its "
                f"{delegation.kind.value}, so cannot delegate it either; ask someone else with authority: "
                f"{pending.allowed}"
            )

    async def delegate(self, delegation: Delegation) -> list[str]:
        """Let `delegation.delegate` decide one kind of decision; a pending request of that kind follows."""
        delegates = dict(self.state.delegates)
        people = list(delegates.get(delegation.kind.value, []))
        if delegation.delegate not in people:
            people.append(delegation.delegate)
        delegates[delegation.kind.value] = people
        pending = self.state.pending
        if pending is not None and pending.kind is delegation.kind:
            pending = pending.changed(delegates=list(people))
        self._set(delegates=delegates, pending=pending)
        await self.trail.record(
            AuditKind.DELEGATED,
            f"{delegation.granted_by} delegated {delegation.kind.value} decisions to {delegation.delegate}",
            actor=delegation.granted_by,
            detail={
                "kind": delegation.kind.value,
                "delegate": delegation.delegate,
                "channel": delegation.channel.value,
            },
        )
        return people

    def allowed(self, kind: DecisionKind) -> list[str]:
        return self._deciders() + self.state.delegates.get(kind.value, [])

    def actors(self) -> list[str]:
        """The deciders and everyone they delegated any decision to: who may amend or cancel."""
        return sorted({*self._deciders(), *(p for names in self.state.delegates.values() for p in names)})

    def may_act(self, who: str) -> bool:
        return who.lower() in self.actors()

    # ---- what the workflow calls ---------------------------------------------------------------------

    async def ask(
        self,
        kind: DecisionKind,
        question: str,
        options: type[E],
        evidence: Sequence[str],
        waiting: Waiting,
        *,
        ticket_id: str,
        before_write: Callable[[DecisionRequest], None] = lambda request: None,
        excluded: Sequence[str] = (),
    ) -> Answer[E] | None:
        """Ask, then wait for the answer (None when interrupted). A request carried over from the previous
        run of this workflow (continue-as-new) of the same kind is waited on again, not asked twice.
        `excluded` may not answer even when they are deciders or delegates (a filer, for their own dispatch)."""
        carried = self.state.pending
        if carried is None or carried.kind is not kind:
            await self.request(
                kind,
                question,
                options,
                evidence,
                ticket_id=ticket_id,
                before_write=before_write,
                excluded=excluded,
            )
        return await self.wait(options, waiting)

    async def request(
        self,
        kind: DecisionKind,
        question: str,
        options: type[E],
        evidence: Sequence[str],
        *,
        ticket_id: str,
        before_write: Callable[[DecisionRequest], None] = lambda request: None,
        excluded: Sequence[str] = (),
    ) -> DecisionRequest:
        """Make the request, write it to the trail (`before_write` moves the workflow's status first), post it."""
        number = self.state.requests_made + 1
        request = DecisionRequest(
            id=f"{self.prefix}-{kind.value}-{number}",
            ticket_id=ticket_id,
            kind=kind,
            question=question,
            options=[option.value for option in options],
            evidence=list(evidence),
            deciders=self._deciders(),
            delegates=self.state.delegates.get(kind.value, []),
            requested_at=workflow.now(),
            subject=self.subject,
            excluded=list(excluded),
        )
        self._set(requests_made=number, pending=request)
        self._answer = None
        before_write(request)
        await self.trail.record(
            AuditKind.DECISION_REQUESTED,
            f"asked {', '.join(request.allowed)}: {question}",
            decision_request=request,
            detail={"request": request.id, "subject": self.subject.model_dump_json()},
        )
        await self._notify(request)
        return request

    async def wait(self, options: type[E], waiting: Waiting) -> Answer[E] | None:
        """Wait for the pending request's answer, reminding on the interval; record it and return it."""
        while True:
            try:
                await workflow.wait_condition(
                    lambda: self._answer is not None or waiting.interrupted(), timeout=waiting.reminder
                )
            except TimeoutError:
                await self._remind()
                if waiting.continue_as_new is not None and waiting.history_is_long():
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    await self.trail.flush()
                    if self._answer is None and not waiting.interrupted():
                        waiting.continue_as_new()
                continue
            break
        answer, request = self._answer, self.state.pending
        if waiting.interrupted() or answer is None or request is None:
            return None
        self._answer = None
        self._set(decisions=[*self.state.decisions, answer], pending=None)
        await self.trail.record(
            AuditKind.DECIDED,
            f"{answer.decided_by} chose {answer.option!r} for {request.id} via {answer.channel.value}",
            actor=answer.decided_by,
            decision=answer,
            detail={"request": request.id, "option": answer.option, "channel": answer.channel.value},
            wait=False,  # the work the answer allows goes on while it is written
        )
        # The validator checked the option against the request's, which are this enum's values.
        return Answer(option=options(answer.option), decision=answer)

    def withdraw(self) -> None:
        """The subject no longer needs an answer (cancelled, stopped): the store marks it when the subject closes."""
        self._set(pending=None)
        self._answer = None

    async def _remind(self) -> None:
        request = self.state.pending
        if request is None:
            raise BrokenInvariant("a reminder for no pending request: only a pending request is waited on")
        request = request.changed(reminders_sent=request.reminders_sent + 1)
        self._set(pending=request)
        await self.trail.record(
            AuditKind.DECISION_REMINDER,
            f"reminder {request.reminders_sent}: {request.id} still waits for a decision",
        )
        await self._notify(request)

    async def _notify(self, request: DecisionRequest) -> None:
        """Tell the deciders (Slack); a notification problem is logged and never blocks the workflow."""
        if not self._notify_on():
            return
        try:
            await NOTIFY_DECISION_REQUEST.execute(
                request, start_to_close_timeout=NOTIFY_TIMEOUT, retry_policy=NOTIFY_RETRY
            )
        except ActivityError as error:
            workflow.logger.warning("notifying %s failed: %s", request.id, error)

    def _set(self, **changes: object) -> None:
        self.state = self.state.changed(**changes)
