"""A question that belongs to no ticket, decided in the decider's console in Chromium over the real API, dev
server and workers: Wayne signs in, finds the question waiting for him (no ticket link: it has no ticket), answers
it with a note, and the question closes with his answer on the console channel."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.decisions.questions import QuestionState
from daedalus.devserver import DevServer
from daedalus.services import questions
from daedalus.store.database import session_scope
from daedalus.store.tables import DecisionRow
from tests.browser.conftest import Visit, watch
from tests.browser.test_console import POLICY, console, sign_in
from tests.decisions.test_questions import wait_status

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "questions"


async def test_wayne_answers_a_question_in_the_console(
    browser_context: Any,
    visit: Visit,
    temporal_server: DevServer,
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    from tests.support import running_workers

    spec = questions.load_question(EXAMPLES / "dense-models.yaml")
    spec = spec.model_copy(
        update={"id": f"dm-{task_queue[-8:]}", "deadline": datetime.now(UTC) + timedelta(days=1)}
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, "local"):
        await questions.ask(
            temporal_client, spec, queue=task_queue, asked_by="lead", policy=POLICY, store=sqlite_engine
        )
        await wait_status(temporal_client, spec.id, lambda s: s.pending_decision is not None)
        with console(sqlite_engine, temporal_server, task_queue) as base:
            page = await browser_context.new_page()
            watch(page, visit)
            await sign_in(page, base, "wayne")
            card = page.locator(f"article.waiting[data-ticket='question:{spec.id}']")
            await card.wait_for()
            assert await card.locator("h2.question-subject").inner_text() == f"question {spec.id}"
            assert spec.question in await card.locator(".question").inner_text()
            await card.locator("textarea[name=note]").fill("screen each one first")
            await card.locator("button.option-screen-first").click()
            await page.wait_for_url(f"{base}/console")
            flash = await page.locator(".flash.ok").last.inner_text()
            assert f"wayne chose 'screen-first' for {spec.id}-question-1" in flash, flash
        done = await wait_status(temporal_client, spec.id, lambda s: s.status.is_closed)
    assert (
        done.status is QuestionState.ANSWERED
        and done.outcome == "screen-first"
        and done.decided_by == "wayne"
    )
    with session_scope(sqlite_engine) as session:
        row = session.get(DecisionRow, f"{spec.id}-question-1")
        assert row is not None and (row.decided_by, row.channel, row.note) == (
            "wayne",
            "console",
            "screen each one first",
        )
    assert not visit.off_host(), visit.off_host()
    assert not visit.console_errors, visit.console_errors
