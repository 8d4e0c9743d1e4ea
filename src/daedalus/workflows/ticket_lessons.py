"""A ticket's lessons: read for the engine and host before each attempt (they go into the agent's prompt), and
recorded when the ticket learns something: the traps its agent reported, a decider's note on a decision, and
how it closed. Lessons attach to the ticket's engine (its host when it has none), in the store on the control
queue, idempotent on (subject, text), so a retried or replayed write records nothing twice.

Lessons are advice: a store that cannot be read or written is logged and never holds a ticket up. Every call
here adds commands, so all of it waits for the patch `ticket-lessons` (histories recorded before it have none).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import LESSONS_FOR, RECORD_LESSONS
    from daedalus.decisions.schemas import Decision
    from daedalus.schemas.agents import AgentResult
    from daedalus.schemas.gates import Verdict
    from daedalus.schemas.lessons import (
        Lesson,
        LessonBatch,
        LessonQuery,
        decision_note_lesson,
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
LESSONS_TIMEOUT = timedelta(seconds=30)
LESSONS_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=1))


def _engine(spec: TicketSpec) -> str | None:
    return spec.engine.name if spec.engine else None


class TicketLessons:
    def __init__(self, patches: PatchesAtStart) -> None:
        self.patches = patches
        self.read_locally = False

    def decide(self) -> None:
        """Ask `LESSONS_READ_LOCALLY`: call it in `run`'s first activation, before anything that awaits."""
        self.read_locally = workflow.patched(LESSONS_READ_LOCALLY)

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

    async def decision_note(self, spec: TicketSpec, question: str, answer: Decision) -> None:
        """A decider's note on a decision ("KV quantization is always TBQ"); a bare click teaches nothing."""
        if answer.note.strip() and self._on():
            await self._record(
                spec,
                decision_note_lesson(
                    request_id=answer.request_id,
                    question=question,
                    option=answer.option,
                    note=answer.note,
                    decided_by=answer.decided_by,
                    engine=_engine(spec),
                    host=spec.host,
                    at=workflow.now(),
                ),
            )

    async def outcome(
        self, spec: TicketSpec, status: TicketStatus, reason: str, attempts: list[AttemptSummary]
    ) -> None:
        """How the ticket closed, with the gates that failed on the way (a plain pass records nothing)."""
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
        if lessons and self._on():
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
