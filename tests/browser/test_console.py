"""The decider's console in Chromium, over the real API, a real Temporal dev server and real workers: Wayne signs
in with his token, sees the ticket waiting for him with the commands it will run, approves it with a note he
marks as a lesson, and watches it pass; and what the console refuses (a wrong token, a form without its CSRF
token, a person the policy gives no say, a delegation the policy would not honour) is refused with its reason."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy import Engine
from sqlmodel import select
from temporalio.client import Client

from daedalus import services
from daedalus.api import create_app
from daedalus.api.settings import ApiSettings
from daedalus.decisions.policy import Policy
from daedalus.devserver import DevServer
from daedalus.payloads import DATA_CONVERTER
from daedalus.ports import free_port, wait_until_open
from daedalus.schemas.ticket import TicketSpec, TicketStatus
from daedalus.slack.settings import SlackSettings
from daedalus.store import tokens as api_tokens
from daedalus.store.database import session_scope
from daedalus.store.tables import DecisionRow, LessonRow
from daedalus.workflows.ticket import TicketWorkflow
from tests.browser.conftest import Visit, watch
from tests.support import make_engine_repo, running_workers, ticket_spec, wait_for
from tests.ticket_helpers import events, host_of, kinds

TOKENS = {
    f"dtk_0000000{n}_{(person * 11)[:43]}": person
    for n, person in enumerate(("wayne", "mallory", "lead", "alice"), 1)
}
POLICY = Policy.model_validate(
    {
        "people": {
            "wayne": {"roles": ["decider", "filer"]},
            "lead": {"roles": ["lead"]},
            "alice": {"roles": ["filer"]},
            "mallory": {"roles": ["filer"]},
        },
        "delegations": [{"granted_by": "wayne", "delegate": "lead", "kind": "dispatch"}],
    }
)
WAIT_MS = 120_000


def token_of(person: str) -> str:
    [token] = [t for t, p in TOKENS.items() if p == person]
    return token


@contextmanager
def console(engine: Engine, server: DevServer, control_queue: str) -> Iterator[str]:
    """The API (console included) under uvicorn in a thread, over the session's Temporal and `engine`, with
    the policy above. Its Temporal client connects in uvicorn's own event loop, on first use."""
    for token, person in TOKENS.items():
        api_tokens.add(engine, person, token, created_by="tests")

    async def connect() -> Client:
        return await Client.connect(server.address, data_converter=DATA_CONVERTER)

    app = create_app(
        engine=engine,
        control_queue=control_queue,
        client_factory=connect,
        settings=ApiSettings(update_timeout_s=30),
        slack=SlackSettings(bot_token=None, channel=None),
        policy=POLICY,
    )
    port = free_port()
    server_ = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server_.run, daemon=True)
    thread.start()
    wait_until_open(port, "uvicorn", timeout_s=30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server_.should_exit = True
        thread.join(timeout=10)


async def file_as_alice(client: Client, spec: TicketSpec, queue: str, engine: Engine) -> None:
    """Alice files; the policy does not make her an operator, so the dispatch waits for Wayne (or the lead)."""
    await services.file_ticket(client, spec, queue=queue, filed_by="alice", policy=POLICY, store=engine)


def needs_approval(tmp_path: Path, host: str, **overrides: Any) -> TicketSpec:
    return ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval={}, **overrides)


async def sign_in(page: Any, base: str, person: str) -> None:
    await page.goto(f"{base}/console")
    assert page.url.startswith(f"{base}/console/login"), page.url
    await page.fill("#token", token_of(person))
    await page.click("#sign-in")
    await page.wait_for_url(f"{base}/console")
    assert await page.locator("#person").inner_text() == person


async def test_wayne_approves_a_ticket_in_the_console_and_watches_it_pass(
    browser_context: Any,
    visit: Visit,
    temporal_server: DevServer,
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    host = host_of(task_queue)
    spec = needs_approval(tmp_path, host)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        await file_as_alice(temporal_client, spec, task_queue, sqlite_engine)
        handle = temporal_client.get_workflow_handle_for(TicketWorkflow.run, f"ticket-{spec.id}")
        await wait_for(handle, lambda s: s.pending_decision is not None)
        with console(sqlite_engine, temporal_server, task_queue) as base:
            page = await browser_context.new_page()
            watch(page, visit)
            await sign_in(page, base, "wayne")
            # What waits for him, with its evidence: the exact commands and where they run.
            card = page.locator(f"article.waiting[data-ticket='{spec.id}']")
            await card.wait_for()
            evidence = await card.locator(".evidence").inner_text()
            assert (
                f"ticket {spec.id} on {host}: build (in a private checkout of {tmp_path / 'repo'} at main"
                in (evidence)
            ), evidence
            assert "gate decode" in evidence and "emit_samples.py speed.txt" in evidence, evidence
            assert "may answer: wayne, lead" in await card.locator(".meta").inner_text()
            # He approves, with a note he marks as a lesson.
            await card.locator("textarea[name=note]").fill("the toy repo's speed.txt is what the gate reads")
            await card.locator("input[name=lesson]").check()
            await card.locator("button.option-approve").click()
            await page.wait_for_url(f"{base}/console")
            flash = await page.locator(".flash.ok").last.inner_text()
            assert f"wayne chose 'approve' for {spec.id}-dispatch-1" in flash, flash
            assert "recorded as a lesson" in flash
            # The ticket's page, one click away, follows it live to its close.
            await page.goto(f"{base}/console/tickets/{spec.id}")
            await page.locator("#status", has_text="passed").wait_for(timeout=WAIT_MS)
            gate = page.locator("#attempts tr.gate[data-gate='decode']")
            text = await gate.inner_text()
            assert "PASS" in text and re.search(
                r"median 5\d\.\d tok/s\s+90% CI \[5\d\.\d+, 5\d\.\d+\]", text
            ), text
            await page.click("#trail-link")
            trail = await page.locator("#trail").inner_text()
            assert "wayne" in trail and "closed passed" in trail, trail
            # The report, one click away, opens in the same session.
            await page.click("#nav-report")
            assert await page.locator("section#tickets > h2").inner_text() == "Tickets"
        state = await handle.result()
    assert state.status is TicketStatus.PASSED
    with session_scope(sqlite_engine) as session:
        decision = session.get(DecisionRow, f"{spec.id}-dispatch-1")
        assert decision is not None and (decision.decided_by, decision.channel) == ("wayne", "console")
        lessons = session.exec(select(LessonRow).where(LessonRow.source == decision.request_id)).all()
    assert [lesson.text for lesson in lessons] == [
        "wayne on the dispatch of ticket " + spec.id + ": the toy repo's speed.txt is what the gate reads"
    ], [lesson.text for lesson in lessons]
    assert not visit.off_host(), visit.off_host()
    assert not visit.console_errors, visit.console_errors


async def test_the_console_refuses_with_its_reason(
    browser_context: Any,
    visit: Visit,
    temporal_server: DevServer,
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    host = host_of(task_queue)
    spec = needs_approval(tmp_path, host)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        await file_as_alice(temporal_client, spec, task_queue, sqlite_engine)
        handle = temporal_client.get_workflow_handle_for(TicketWorkflow.run, f"ticket-{spec.id}")
        await wait_for(handle, lambda s: s.pending_decision is not None)
        request_id = f"{spec.id}-dispatch-1"
        with console(sqlite_engine, temporal_server, task_queue) as base:
            page = await browser_context.new_page()
            watch(page, visit)
            # A wrong token signs nobody in.
            await page.goto(f"{base}/console/login")
            await page.fill("#token", "dtk_0000000f_" + "x" * 43)
            await page.click("#sign-in")
            assert "unknown bearer token" in await page.locator("#login-error").inner_text()
            assert not [c for c in await page.context.cookies() if c["name"] == "daedalus_console"]
            # Mallory is a filer, not a decider: the console says so and offers her no answer...
            await sign_in(page, base, "mallory")
            await page.goto(f"{base}/console/tickets/{spec.id}")
            refusal = await page.locator(".not-yours").inner_text()
            assert "You (mallory) may not answer this: mallory may not decide dispatch" in refusal, refusal
            assert await page.locator("form.decide").count() == 0
            # ...and answering anyway, with her own session's CSRF token, is refused by the same checks.
            csrf = await page.locator("input[name=csrf]").first.get_attribute("value")
            answered = await page.request.post(
                f"{base}/console/decisions",
                form={
                    "csrf": csrf or "",
                    "request_id": request_id,
                    "option": "approve",
                    "ticket_id": spec.id,
                },
            )
            assert answered.ok  # the page it lands on says why
            said = await answered.text()
            assert "refused: " in said and "mallory may not decide dispatch" in said, said
            # A form without the session's CSRF token is refused before anything is read.
            forged = await page.request.post(
                f"{base}/console/decisions", form={"request_id": request_id, "option": "approve"}
            )
            assert forged.status == 403 and "CSRF token is missing" in await forged.text()
            await page.click("button.link")  # sign out
            await page.wait_for_url(f"{base}/console/login")
            # Wayne may decide, but a dispatch delegation made at run time would never be honoured: refused up front.
            await sign_in(page, base, "wayne")
            await page.goto(f"{base}/console/tickets/{spec.id}")
            await page.fill("#delegate-to", "mallory")
            await page.select_option("#delegate-kind", "dispatch")
            await page.click("#delegate button[type=submit]")
            error = await page.locator(".flash.error").inner_text()
            assert "a delegation made at run time never lets mallory approve a dispatch" in error, error
            # Bad input is named: a cancellation needs a reason.
            await page.click("#cancel button[type=submit]")
            error = await page.locator(".flash.error").inner_text()
            assert "reason" in error, error
            # Nothing above was written: the request still waits, nobody delegated.
            assert "delegated" not in kinds(events(sqlite_engine, spec.id))
            assert "decided" not in kinds(events(sqlite_engine, spec.id))
            # Cancelling with a reason goes through.
            await page.fill("#cancel-reason", "superseded by a better fix")
            await page.click("#cancel button[type=submit]")
            assert "cancel requested by wayne" in await page.locator(".flash.ok").last.inner_text()
            await page.locator("#status", has_text="cancelled").wait_for(timeout=WAIT_MS)
        state = await handle.result()
    assert state.status is TicketStatus.CANCELLED
    assert state.outcome_reason == "cancelled by wayne: superseded by a better fix"
    assert not visit.off_host(), visit.off_host()
