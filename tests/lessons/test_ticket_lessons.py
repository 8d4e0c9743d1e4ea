"""Tickets learn on their own: an agent's reported trap, the note the decider marked as a lesson and a failure with
its cause are recorded as lessons on the ticket's engine, and the next attempt's prompt carries what the earlier
ones recorded; an unmarked note and a cancellation teach nothing. Real dev server, real store, the scripted agent
in its sandbox; the report lists what was recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.report.gather import build_report
from daedalus.report.render import render_markdown
from daedalus.schemas.lessons import Lesson, LessonKind, SubjectKind
from daedalus.schemas.ticket import Decision, TicketStatus
from daedalus.store import lessons as lesson_store
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.ticket import TicketWorkflow
from tests.replay_split import replay_split_too
from tests.support import SLOW_PATCH, make_engine_repo, running_workers, start_ticket, ticket_spec, wait_for
from tests.ticket_helpers import host_of
from tests.workflows.test_ticket_replay import replayer

TRAP = "speed.txt is read once at start, so a rebuild is needed to see a change"
EARLIER = "the toy engine's decode gate wants at least 55 tok/s"


async def test_a_ticket_records_its_trap_note_and_outcome_and_the_retry_reads_them(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    with session_scope(sqlite_engine) as session:
        lesson_store.record(
            session=session,
            lesson=Lesson(
                subject_kind=SubjectKind.ENGINE,
                subject="toy",
                kind=LessonKind.TRAP,
                text=EARLIER,
                source="seed",
                recorded_at=datetime.now(UTC),
            ),
        )
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"),
        host,
        agent={"name": "scripted", "patch": SLOW_PATCH, "commands": [f"echo 'TRAP: {TRAP}'"]},
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await start_ticket(temporal_client, spec, task_queue)
        state = await wait_for(handle, lambda s: s.pending_decision is not None, timeout=120)
        request = state.pending_decision
        assert request is not None and "2 of 2 attempts used" in request.question
        await handle.execute_update(
            TicketWorkflow.decide,
            Decision(
                request_id=request.id,
                option="fail",
                decided_by="wayne",
                note="40 tok/s patches are a dead end",
                lesson=True,
            ),
        )
        final = await handle.result()
    assert final.status is TicketStatus.FAILED
    await replay_split_too(replayer(), await handle.fetch_history())  # the lessons' commands replay

    prompts = tmp_path / "artifacts" / "tickets" / spec.id
    first, second = ((prompts / f"attempt-{n}" / "prompt.md").read_text() for n in (1, 2))
    assert EARLIER in first and TRAP not in first  # what the store held before the ticket
    assert EARLIER in second and TRAP in second  # and what attempt 1 reported, for attempt 2

    with session_scope(sqlite_engine) as session:
        rows = queries.lessons(session=session, engine="toy")
        recorded = {(row.kind, row.source): row.text for row in rows}
        report = render_markdown(build_report(session=session, since=datetime.now(UTC) - timedelta(hours=1)))
    assert recorded[(LessonKind.TRAP.value, spec.id)] == TRAP  # once, though both attempts reported it
    assert sum(row.kind == LessonKind.TRAP.value and row.source == spec.id for row in rows) == 1
    note = recorded[(LessonKind.DECISION_NOTE.value, request.id)]
    assert note == f"wayne on the escalation of ticket {spec.id}: 40 tok/s patches are a dead end"
    outcome = recorded[(LessonKind.OUTCOME.value, spec.id)]
    assert outcome.startswith(
        f"ticket {spec.id} (MTP align tax fix (test)) ended failed; cause: gate decode FAIL on attempt 2: median "
    ) and outcome.endswith("rule decode_tps >= 55 -> FAIL"), outcome
    for text in (TRAP, "40 tok/s patches are a dead end", f"ticket {spec.id} (MTP align tax fix (test))"):
        assert text in report


async def test_an_unmarked_note_and_a_cancellation_record_no_lesson(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    """ "approved over the API" is a decision note, not advice for the next agent; a cancellation is a person's
    call, not a finding about the engine."""
    host = host_of(task_queue)
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"), host, approval={"dispatch_requires_approval": True}
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await start_ticket(temporal_client, spec, task_queue)
        state = await wait_for(handle, lambda s: s.pending_decision is not None, timeout=120)
        assert state.pending_decision is not None
        await handle.execute_update(
            TicketWorkflow.decide,
            Decision(
                request_id=state.pending_decision.id,
                option="reject",
                decided_by="wayne",
                note="approved over the API",
            ),
        )
        final = await handle.result()
    assert final.status is TicketStatus.CANCELLED
    assert final.decisions[0].note == "approved over the API"  # the note stays, as a decision note
    with session_scope(sqlite_engine) as session:
        assert [row.text for row in queries.lessons(session=session, engine="toy")] == []
