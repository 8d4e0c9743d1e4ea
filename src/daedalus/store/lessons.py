"""Write lessons: idempotent on (subject kind, subject, text), so a retried activity records nothing twice."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from daedalus.schemas.lessons import Lesson
from daedalus.store.tables import LessonRow


def record(*, session: Session, lesson: Lesson) -> bool:
    """Write one lesson; False when the same lesson was already recorded for that subject."""
    if _exists(session, lesson):
        return False
    session.add(LessonRow(**lesson.model_dump(mode="python")))
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        if _exists(session, lesson):
            return False  # a concurrent retry wrote it first
        raise
    return True


def _exists(session: Session, lesson: Lesson) -> bool:
    query = select(LessonRow.id).where(
        LessonRow.subject_kind == lesson.subject_kind.value,
        LessonRow.subject == lesson.subject,
        LessonRow.text == lesson.text,
    )
    return session.exec(query).first() is not None
