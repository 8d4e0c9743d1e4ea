"""Lessons: what a ticket's outcome, an agent's reported traps and a decider's notes taught the team.

A lesson is attached to an engine or a host; later specs and agent prompts on that engine or host carry it,
and the report lists it. The helpers here are pure (safe inside workflows): they turn a closed ticket, an
agent's result or a decision into the lessons to record.
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
    """The decider's note on a decision ("KV quantization is always TBQ")."""


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
    """A closed ticket's outcome, as a lesson on its engine (or host when it has none).

    A plain pass teaches nothing new and records nothing; every other ending does, with its reason.
    """
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
    """A decider's note becomes a lesson when there is one; a bare button click teaches nothing."""
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
