"""Lessons in the store (control queue): record them, and read them for a spec or an agent's prompt."""

from __future__ import annotations

import asyncio

from sqlalchemy import Engine
from temporalio import activity

from daedalus.schemas.lessons import LessonBatch, LessonQuery
from daedalus.store import lessons as lesson_store
from daedalus.store import queries
from daedalus.store.database import session_scope


def lesson_lines(*, engine: Engine, query: LessonQuery) -> list[str]:
    """The newest `limit` lessons of the engine and host, oldest first, each with its source."""
    with session_scope(engine) as session:
        rows = queries.lessons(session=session, engine=query.engine, host=query.host, limit=query.limit)
        return [
            f"{row.text} ({row.kind}, {row.recorded_at:%Y-%m-%d}{', ' + row.source if row.source else ''})"
            for row in rows
        ]


class LessonActivities:
    def __init__(self, engine: Engine):
        self.engine = engine

    @activity.defn(name="record_lessons")
    async def record_lessons(self, batch: LessonBatch) -> int:
        """Write the lessons in one transaction; returns how many were new (a retry writes none)."""
        return await asyncio.to_thread(self._record, batch)

    def _record(self, batch: LessonBatch) -> int:
        with session_scope(self.engine) as session:
            return sum(lesson_store.record(session=session, lesson=lesson) for lesson in batch.lessons)

    @activity.defn(name="lessons_for")
    async def lessons_for(self, query: LessonQuery) -> list[str]:
        """The lessons to put into a spec or an agent's prompt for this engine and host."""
        return await asyncio.to_thread(lesson_lines, engine=self.engine, query=query)
