"""Lessons: what a failure's cause, an agent's reported traps and the notes a person marked taught the team.

A lesson is attached to an engine or a host; later specs and agent prompts on that engine or host carry it,
and the report lists it. Only what teaches is recorded: a trap an agent reported (`TRAP:` lines), a ticket that
failed with its cause (the gates that failed and why, or the last attempt's failure), and a note a person
explicitly marked as a lesson (`daedalus decide ... --lesson`, the console's checkbox, `lessons add`). A decision
note stays a decision note, in the audit trail; a pass, a cancellation or a rejection records nothing. The
helpers here are pure (safe inside workflows).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field, field_validator

from daedalus.schemas._base import Model

MAX_LESSON_CHARS = 500
QUESTION_CHARS = 160


class SubjectKind(StrEnum):
    ENGINE = "engine"
    HOST = "host"


class LessonKind(StrEnum):
    OUTCOME = "outcome"
    """How a ticket closed, and why (its failing gates, the rule that stopped it)."""
    TRAP = "trap"
    """Something an agent or a person tripped over ("profiler interval=100 changes the output")."""
    DECISION_NOTE = "decision_note"
    """A decider's note on a decision that they marked as a lesson ("KV quantization is always TBQ")."""


class Lesson(Model):
    subject_kind: SubjectKind
    subject: str = Field(min_length=1, max_length=200)
    kind: LessonKind
    text: str = Field(min_length=1, max_length=MAX_LESSON_CHARS)
    source: str = Field(default="", max_length=200)
    recorded_by: str = Field(default="", max_length=64)
    recorded_at: datetime

    @field_validator("text")
    @classmethod
    def _one_line(cls, value: str) -> str:
        text = " ".join(value.split())
        if not text:
            raise ValueError("a lesson must not be blank")
        return text


class LessonBatch(Model):
    """The input of `record_lessons`: several lessons written in one transaction."""

    lessons: list[Lesson] = Field(min_length=1, max_length=100)


class LessonQuery(Model):
    """The input of `lessons_for`: the engine and host a spec or prompt concerns."""

    engine: str | None = None
    host: str | None = None
    limit: int = Field(default=30, ge=1, le=200)


def _subjects(engine: str | None, host: str) -> list[tuple[SubjectKind, str]]:
    subjects = [(SubjectKind.HOST, host)]
    if engine:
        subjects.insert(0, (SubjectKind.ENGINE, engine))
    return subjects


def outcome_lessons(
    *,
    ticket_id: str,
    title: str,
    status: str,
    reason: str,
    engine: str | None,
    host: str,
    failed_gates: list[str],
    at: datetime,
) -> list[Lesson]:
    """A closed ticket's outcome, as a lesson on its engine (or host when it has none): what tickets recorded
    before `failure_lessons` (every ending but a plain pass), kept for the histories that replay it."""
    if status == "passed" and not failed_gates:
        return []
    text = f"ticket {ticket_id} ({title}) ended {status.replace('_', ' ')}"
    if reason:
        text += f": {reason}"
    if failed_gates:
        text += f"; gates that failed on the way: {', '.join(failed_gates)}"
    kind, subject = _subjects(engine, host)[0]
    return [
        Lesson(
            subject_kind=kind,
            subject=subject,
            kind=LessonKind.OUTCOME,
            text=text[:MAX_LESSON_CHARS],
            source=ticket_id,
            recorded_by="daedalus",
            recorded_at=at,
        )
    ]


TEACHING_ENDINGS = ("failed", "stopped_by_rules", "closed_under_exception")
"""The closed statuses whose cause is worth telling the next agent: a pass teaches nothing new, and a
cancellation, a rejected dispatch or a termination is a person's call, not a finding about the engine."""
CAUSE_CHARS = 240


def failure_lessons(
    *,
    ticket_id: str,
    title: str,
    status: str,
    engine: str | None,
    host: str,
    causes: list[str],
    at: datetime,
) -> list[Lesson]:
    """A ticket that ended without passing, with its cause, as a lesson on its engine (or host): recorded only
    for a teaching ending (`TEACHING_ENDINGS`) with a cause on record (`causes`: each failing gate with its
    verdict's reason, or the last attempt's failure)."""
    causes = [" ".join(c.split()) for c in causes if c.strip()]
    if status not in TEACHING_ENDINGS or not causes:
        return []
    shown = [c if len(c) <= CAUSE_CHARS else c[: CAUSE_CHARS - 1] + "…" for c in causes]
    text = f"ticket {ticket_id} ({title}) ended {status.replace('_', ' ')}; cause: {'; '.join(shown)}"
    kind, subject = _subjects(engine, host)[0]
    return [
        Lesson(
            subject_kind=kind,
            subject=subject,
            kind=LessonKind.OUTCOME,
            text=text[:MAX_LESSON_CHARS],
            source=ticket_id,
            recorded_by="daedalus",
            recorded_at=at,
        )
    ]


def marked_note_lessons(
    *,
    request_id: str,
    decision_kind: str,
    subject_label: str,
    note: str,
    marked: bool,
    decided_by: str,
    engine: str | None,
    host: str,
    at: datetime,
) -> list[Lesson]:
    """A decider's note, as a lesson only when they marked it as one; unmarked, it stays a decision note."""
    if not marked or not note.strip():
        return []
    kind, subject = _subjects(engine, host)[0]
    text = f"{decided_by} on the {decision_kind} of {subject_label}: {' '.join(note.split())}"
    return [
        Lesson(
            subject_kind=kind,
            subject=subject,
            kind=LessonKind.DECISION_NOTE,
            text=text[:MAX_LESSON_CHARS],
            source=request_id,
            recorded_by=decided_by,
            recorded_at=at,
        )
    ]


def trap_lessons(
    *, ticket_id: str, traps: list[str], engine: str | None, host: str, reported_by: str, at: datetime
) -> list[Lesson]:
    """The traps an agent (or a person) reported on a ticket, each as a lesson on the engine."""
    kind, subject = _subjects(engine, host)[0]
    return [
        Lesson(
            subject_kind=kind,
            subject=subject,
            kind=LessonKind.TRAP,
            text=t[:MAX_LESSON_CHARS],
            source=ticket_id,
            recorded_by=reported_by,
            recorded_at=at,
        )
        for t in traps
        if t.strip()
    ]


def decision_note_lesson(
    *,
    request_id: str,
    question: str,
    option: str,
    note: str,
    decided_by: str,
    engine: str | None,
    host: str,
    at: datetime,
) -> list[Lesson]:
    """Every decider's note as a lesson: what tickets recorded before `marked_note_lessons`, kept for the
    histories that replay it."""
    if not note.strip():
        return []
    kind, subject = _subjects(engine, host)[0]
    asked = " ".join(question.split())
    if len(asked) > QUESTION_CHARS:  # the note is the lesson: a long question must not crowd it out
        asked = asked[: QUESTION_CHARS - 1] + "…"
    text = f"{decided_by} chose {option} on '{asked}': {note}"
    return [
        Lesson(
            subject_kind=kind,
            subject=subject,
            kind=LessonKind.DECISION_NOTE,
            text=text[:MAX_LESSON_CHARS],
            source=request_id,
            recorded_by=decided_by,
            recorded_at=at,
        )
    ]
