"""A ticket's lessons: read for the engine and host before each attempt (they go into the agent's prompt), and
recorded when the ticket learns something: the traps its agent reported, a decider's note they marked as a
lesson, and a failure with its cause (patch `lessons-that-teach`; before it, every note and every ending but a
plain pass was recorded). Lessons attach to the ticket's engine (its host when it has none), in the store on the control
queue, idempotent on (subject, text), so a retried or replayed write records nothing twice.

Lessons are advice: a store that cannot be read or written is logged and never holds a ticket up. Every call
here adds commands, so all of it waits for the patch `ticket-lessons` (histories recorded before it have none).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypedDict

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import LESSONS_FOR, RECORD_LESSONS
    from daedalus.decisions.schemas import Decision, DecisionKind
    from daedalus.schemas.agents import AgentResult
    from daedalus.schemas.gates import Verdict
    from daedalus.schemas.lessons import (
        Lesson,
        LessonBatch,
        LessonQuery,
        decision_note_lesson,
        failure_lessons,
        marked_note_lessons,
        outcome_lessons,
        trap_lessons,
    )
    from daedalus.schemas.ticket import AttemptSummary, TicketSpec, TicketStatus
    from daedalus.workflows.patches import PatchesAtStart

LESSONS_PATCH = "ticket-lessons"
LESSONS_READ_LOCALLY = "ticket-lessons-read-locally"
"""Patch, asked in the run's first activation (patches.py says why there): the lessons for a prompt are read by a
local activity, in the workflow task that dispatches the attempt, instead of a remote one whose completion cost
a workflow task of its own. Runs started before it read them remotely."""
LESSONS_THAT_TEACH = "lessons-that-teach"
"""Patch, asked in the run's first activation: only notes the decider marked as lessons, and failures with
their cause, are recorded. Runs started before it recorded every note and every ending but a plain pass."""
LESSONS_TIMEOUT = timedelta(seconds=30)
LESSONS_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=1))


class _Note(TypedDict):
    """What every lesson from a decider's note records of the decision."""

    request_id: str
    note: str
    decided_by: str


class _Where(TypedDict):
    """What a lesson attaches to, and when it was learnt."""

    engine: str | None
    host: str
    at: datetime


def _engine(spec: TicketSpec) -> str | None:
    return spec.engine.name if spec.engine else None


class TicketLessons:
    def __init__(self, patches: PatchesAtStart) -> None:
        self.patches = patches
        self.read_locally = False
        self.teaching_only = False

    def decide(self, bundled: bool = False) -> None:
        """Ask `LESSONS_READ_LOCALLY` and `LESSONS_THAT_TEACH`: call it in `run`'s first activation, before
        anything that awaits. `bundled`: the run recorded the ticket's patch bundle, which holds both."""
        self.read_locally = bundled or workflow.patched(LESSONS_READ_LOCALLY)
        self.teaching_only = bundled or workflow.patched(LESSONS_THAT_TEACH)

    def _on(self) -> bool:
        return self.patches.patched(LESSONS_PATCH)

    async def for_prompt(self, spec: TicketSpec) -> list[str]:
        """The lessons recorded for the ticket's engine and host, for the next attempt's prompt."""
        if not self._on():
            return []
        query = LessonQuery(engine=_engine(spec), host=spec.host)
        read = LESSONS_FOR.execute_local if self.read_locally else LESSONS_FOR.execute
        try:
            return await read(query, start_to_close_timeout=LESSONS_TIMEOUT, retry_policy=LESSONS_RETRY)
        except ActivityError as error:
            workflow.logger.warning("reading lessons for ticket %s failed: %s", spec.id, error)
            return []

    async def traps(self, spec: TicketSpec, result: AgentResult) -> None:
        """What the agent reported tripping over, on the engine it worked on."""
        if result.traps and self._on():
            await self._record(
                spec,
                trap_lessons(
                    ticket_id=spec.id,
                    traps=result.traps,
                    engine=_engine(spec),
                    host=spec.host,
                    reported_by=result.agent.split(" ")[0],
                    at=workflow.now(),
                ),
            )

    async def decision_note(
        self, spec: TicketSpec, question: str, answer: Decision, kind: DecisionKind
    ) -> None:
        """A decider's note, when they marked it as a lesson ("KV quantization is always TBQ"); an unmarked note
        stays in the audit trail only. (Before `lessons-that-teach`: every note.)"""
        if not answer.note.strip() or not self._on():
            return
        said = _Note(request_id=answer.request_id, note=answer.note, decided_by=answer.decided_by)
        where = _Where(engine=_engine(spec), host=spec.host, at=workflow.now())
        if self.teaching_only:
            label = f"ticket {spec.id}"
            lessons = marked_note_lessons(
                decision_kind=kind.value, subject_label=label, marked=answer.lesson, **said, **where
            )
        else:
            lessons = decision_note_lesson(question=question, option=answer.option, **said, **where)
        await self._record(spec, lessons)

    async def outcome(
        self, spec: TicketSpec, status: TicketStatus, reason: str, attempts: list[AttemptSummary]
    ) -> None:
        """A ticket that failed, with its cause: each gate that failed and why, else the last attempt's failure.
        (Before `lessons-that-teach`: every ending but a plain pass, with the gates that failed on the way.)"""
        if self.teaching_only:
            lessons = failure_lessons(
                ticket_id=spec.id,
                title=spec.title,
                status=status.value,
                engine=_engine(spec),
                host=spec.host,
                causes=failure_causes(attempts),
                at=workflow.now(),
            )
        else:
            failed = [r.gate for a in attempts for r in a.gate_results if r.verdict is Verdict.FAIL]
            lessons = outcome_lessons(
                ticket_id=spec.id,
                title=spec.title,
                status=status.value,
                reason=reason,
                engine=_engine(spec),
                host=spec.host,
                failed_gates=list(dict.fromkeys(failed)),
                at=workflow.now(),
            )
        if lessons and self._on():  # asked only then, as it always was: lazily patched runs replay
            await self._record(spec, lessons)

    async def _record(self, spec: TicketSpec, lessons: list[Lesson]) -> None:
        if not lessons:
            return
        try:
            await RECORD_LESSONS.execute(
                LessonBatch(lessons=lessons),
                start_to_close_timeout=LESSONS_TIMEOUT,
                retry_policy=LESSONS_RETRY,
            )
        except ActivityError as error:
            workflow.logger.warning("recording lessons of ticket %s failed: %s", spec.id, error)


def failure_causes(attempts: list[AttemptSummary]) -> list[str]:
    """Why the attempts failed: each gate's latest FAIL with its reason; without one, the last attempt's
    failure (its build or agent output). Nothing when no attempt was made."""
    latest: dict[str, str] = {}
    for attempt in attempts:
        for result in attempt.gate_results:
            if result.verdict is Verdict.FAIL:
                latest[result.gate] = f"gate {result.gate} FAIL on attempt {attempt.number}: {result.reason}"
    if latest:
        return list(latest.values())
    if attempts and attempts[-1].detail.strip():
        last = attempts[-1]
        return [f"attempt {last.number} {last.outcome.value}: {last.detail}"]
    return []
