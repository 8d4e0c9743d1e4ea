"""Lessons: recorded once per subject, read back for a spec or a prompt, listed by the CLI and the report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine
from temporalio.testing import ActivityEnvironment
from typer.testing import CliRunner

from daedalus.activities.lessons import LessonActivities
from daedalus.agents.prompt import build_prompt, reported_traps
from daedalus.cli import app
from daedalus.schemas.agents import AgentTask
from daedalus.schemas.lessons import (
    Lesson,
    LessonBatch,
    LessonKind,
    LessonQuery,
    SubjectKind,
    decision_note_lesson,
    failure_lessons,
    marked_note_lessons,
    outcome_lessons,
    trap_lessons,
)
from daedalus.schemas.ticket import AgentName, AgentSpec

T0 = datetime(2026, 7, 12, 8, 0, tzinfo=UTC)


def lesson(
    text: str, *, subject: str = "llama.cpp-turbo", kind: SubjectKind = SubjectKind.ENGINE, at: datetime = T0
) -> Lesson:
    return Lesson(
        subject_kind=kind,
        subject=subject,
        kind=LessonKind.TRAP,
        text=text,
        source="6",
        recorded_by="codex",
        recorded_at=at,
    )


async def test_recorded_once_and_read_for_engine_and_host(store_engine: Engine) -> None:
    env = ActivityEnvironment()
    activities = LessonActivities(store_engine)
    batch = LessonBatch(
        lessons=[
            lesson("auto-asymmetric silently promotes K to q8_0; set TURBO_AUTO_ASYMMETRIC=0"),
            lesson(
                "unified memory bypasses cgroup accounting",
                subject="gb10",
                kind=SubjectKind.HOST,
                at=T0 + timedelta(minutes=1),
            ),
            lesson(
                "prefix caching breaks partial prefill", subject="1cat-vllm", at=T0 + timedelta(minutes=2)
            ),
        ]
    )
    assert await env.run(activities.record_lessons, batch) == 3
    assert await env.run(activities.record_lessons, batch) == 0, "a retried write records nothing twice"
    lines = await env.run(activities.lessons_for, LessonQuery(engine="llama.cpp-turbo", host="gb10"))
    assert lines == [
        "auto-asymmetric silently promotes K to q8_0; set TURBO_AUTO_ASYMMETRIC=0 (trap, 2026-07-12, 6)",
        "unified memory bypasses cgroup accounting (trap, 2026-07-12, 6)",
    ]
    assert await env.run(activities.lessons_for, LessonQuery(engine="other", limit=5)) == []


def test_helpers_turn_outcomes_traps_and_notes_into_lessons() -> None:
    assert (
        outcome_lessons(
            ticket_id="4",
            title="MTP",
            status="passed",
            reason="",
            engine="vllm",
            host="mavis",
            failed_gates=[],
            at=T0,
        )
        == []
    ), "a plain pass teaches nothing new"
    [stopped] = outcome_lessons(
        ticket_id="6",
        title="TP4/MTP",
        status="stopped_by_rules",
        reason="the same failure twice",
        engine=None,
        host="mavis",
        failed_gates=["temp-0 identity"],
        at=T0,
    )
    assert stopped.subject_kind is SubjectKind.HOST and stopped.subject == "mavis"
    assert stopped.text == (
        "ticket 6 (TP4/MTP) ended stopped by rules: the same failure twice; "
        "gates that failed on the way: temp-0 identity"
    )
    traps = trap_lessons(
        ticket_id="6",
        traps=["profiler interval=100 changes the output", " "],
        engine="vllm",
        host="mavis",
        reported_by="codex",
        at=T0,
    )
    assert [t.text for t in traps] == ["profiler interval=100 changes the output"]
    assert (
        decision_note_lesson(
            request_id="r",
            question="q",
            option="approve",
            note="",
            decided_by="wayne",
            engine="vllm",
            host="mavis",
            at=T0,
        )
        == []
    )
    [note] = decision_note_lesson(
        request_id="kv-1",
        question="Which KV?",
        option="tbq",
        note="always TBQ",
        decided_by="wayne",
        engine="vllm",
        host="mavis",
        at=T0,
    )
    assert note.kind is LessonKind.DECISION_NOTE and note.text == "wayne chose tbq on 'Which KV?': always TBQ"
    with pytest.raises(ValidationError, match="blank"):
        lesson("   \n ")


def test_only_what_teaches_becomes_a_lesson() -> None:
    """A failure with its cause and a note the decider marked; not a pass, a cancellation or an unmarked note."""
    common = {"ticket_id": "6", "title": "TP4/MTP", "engine": "vllm", "host": "mavis", "at": T0}
    cause = ["gate temp-0 FAIL on attempt 2: first divergence at token 17, logprob gap 0.9 >= 0.25"]
    for status in ("passed", "cancelled", "terminated"):
        assert failure_lessons(status=status, causes=cause, **common) == [], status
    assert failure_lessons(status="failed", causes=[" "], **common) == [], "a failure with no cause on record"
    [failed] = failure_lessons(status="stopped_by_rules", causes=cause, **common)
    assert failed.kind is LessonKind.OUTCOME and failed.text == (
        "ticket 6 (TP4/MTP) ended stopped by rules; cause: gate temp-0 FAIL on attempt 2: first divergence at "
        "token 17, logprob gap 0.9 >= 0.25"
    )
    note = {
        "request_id": "6-dispatch-1",
        "decision_kind": "dispatch",
        "subject_label": "ticket 6",
        "decided_by": "wayne",
        "engine": "vllm",
        "host": "mavis",
        "at": T0,
    }
    assert marked_note_lessons(note="approved over the API", marked=False, **note) == []
    assert marked_note_lessons(note="  ", marked=True, **note) == []
    [marked] = marked_note_lessons(note="KV quantization is always TBQ", marked=True, **note)
    assert marked.kind is LessonKind.DECISION_NOTE and marked.source == "6-dispatch-1"
    assert marked.text == "wayne on the dispatch of ticket 6: KV quantization is always TBQ"


def test_agent_traps_are_read_from_the_final_message_and_lessons_reach_the_prompt() -> None:
    final = "Fixed it.\n- TRAP: profiler  interval=100 changes the output\nTRAP: \ntrap: drafts race\nRESULT: success"
    assert reported_traps(final) == ["profiler interval=100 changes the output", "drafts race"]
    assert reported_traps(None) == []
    task = AgentTask(
        ticket_id="6",
        attempt=1,
        agent=AgentSpec(name=AgentName.CODEX),
        brief="b",
        repo="/r",
        base_commit="a" * 40,
        worktree="/w",
        branch="b",
        allowed_paths=["src"],
        lessons=["prefix caching breaks partial prefill (trap, 2026-07-12, 3)"],
        engine="1cat-vllm",
    )
    prompt = build_prompt(task)
    assert "## Lessons recorded for 1cat-vllm\n\n- prefix caching breaks partial prefill" in prompt
    assert "TRAP:" in prompt


def test_cli_adds_and_lists_lessons(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"DAEDALUS_HOME": str(tmp_path / "home")}
    added = runner.invoke(
        app,
        ["lessons", "add", "always measure with interval=300", "--engine", "1cat-vllm", "--source", "6"],
        env=env,
    )
    assert added.exit_code == 0 and "lesson recorded on engine 1cat-vllm" in added.output, added.output
    again = runner.invoke(
        app, ["lessons", "add", "always measure with interval=300", "--engine", "1cat-vllm"], env=env
    )
    assert "already recorded" in again.output
    both = runner.invoke(app, ["lessons", "add", "x", "--engine", "e", "--host", "h"], env=env)
    assert both.exit_code == 2 and "exactly one subject" in both.output
    listed = runner.invoke(app, ["lessons", "list", "--engine", "1cat-vllm"], env=env)
    assert "always measure with interval=300" in listed.output and "trap" in listed.output
