"""`daedalus lessons ...`: record a lesson or trap on an engine or host, and list them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from daedalus.cli._common import console, fail, store
from daedalus.escaping import for_terminal
from daedalus.schemas.lessons import Lesson, LessonKind, SubjectKind
from daedalus.store import lessons as lesson_store
from daedalus.store import queries
from daedalus.store.database import session_scope

app = typer.Typer(add_completion=False, help="Lessons and traps, attached to an engine or a host.")


def _subject(engine: str | None, host: str | None) -> tuple[SubjectKind, str]:
    if (engine is None) == (host is None):
        fail("name exactly one subject: --engine NAME or --host NAME")
    return (SubjectKind.ENGINE, engine) if engine is not None else (SubjectKind.HOST, host or "")


@app.command()
def add(
    text: Annotated[str, typer.Argument(help="the lesson, one line")],
    engine: Annotated[str | None, typer.Option(help="the engine it concerns")] = None,
    host: Annotated[str | None, typer.Option(help="the host it concerns")] = None,
    kind: Annotated[LessonKind, typer.Option(help="outcome, trap or decision_note")] = LessonKind.TRAP,
    source: Annotated[str, typer.Option(help="where it came from: a ticket id, a request id")] = "",
    as_: Annotated[str, typer.Option("--as", help="who records it")] = "lead",
) -> None:
    """Record a lesson; later specs and agent prompts on that engine or host carry it, and the report lists it."""
    subject_kind, subject = _subject(engine, host)
    try:
        lesson = Lesson(subject_kind=subject_kind, subject=subject, kind=kind, text=text, source=source,
                        recorded_by=as_, recorded_at=datetime.now(UTC))  # fmt: skip
    except ValidationError as error:
        fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()))
    with session_scope(store()) as session:
        new = lesson_store.record(session=session, lesson=lesson)
    console.print(
        f"lesson recorded on {subject_kind.value} {for_terminal(subject)}" if new else "already recorded"
    )


@app.command("list")
def list_(
    engine: Annotated[str | None, typer.Option(help="lessons of this engine")] = None,
    host: Annotated[str | None, typer.Option(help="lessons of this host")] = None,
) -> None:
    """Lessons, oldest first (all of them, or those of an engine and/or a host)."""
    with session_scope(store()) as session:
        rows = queries.lessons(session=session, engine=engine, host=host)
    table = Table("recorded", "kind", "subject", "lesson", "source")
    for row in rows:
        table.add_row(f"{row.recorded_at:%Y-%m-%d}", row.kind, f"{row.subject_kind} {for_terminal(row.subject)}",
                      for_terminal(row.text), for_terminal(row.source or "-"))  # fmt: skip
    console.print(table)
