"""What a person sees in Chromium: the HTML report (from a file and from /report) and the API docs, offline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine

from daedalus.report import build_report, render_html
from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord, TicketSnapshot
from daedalus.schemas.lessons import Lesson, LessonKind, SubjectKind
from daedalus.store import lessons
from daedalus.store.database import session_scope
from daedalus.store.records import apply
from tests.browser.conftest import Visit, watch
from tests.browser.server import serving
from tests.report.seeded import fill
from tests.support import TEST_AUDIT_KEY

SECTIONS = {
    "status": "Status",
    "tickets": "Tickets",
    "campaigns": "Campaigns",
    "training": "Training runs",
    "decisions": "Decisions",
    "lessons": "Lessons and traps",
}
WAYNE = "dtk_0000000b_" + "w" * 43
TOKENS = {WAYNE: "wayne"}


async def offline(context: Any, visit: Visit) -> None:
    """Abort (and record) any request that would leave this machine: the pages must not need one."""

    async def route(request_route: Any) -> None:
        url = request_route.request.url
        if Visit(requests=[url]).off_host():
            visit.requests.append(url)
            await request_route.abort()
        else:
            await request_route.continue_()

    await context.route("**/*", route)


async def check_report_page(page: Any, visit: Visit) -> None:
    for anchor, title in SECTIONS.items():
        heading = page.locator(f"section#{anchor} > h2")
        assert await heading.inner_text() == title
        assert await heading.is_visible()
    cards = page.locator("#cards .card")
    assert await cards.count() == 6
    assert "PASS 55.9 tok/s" in await cards.first.inner_text()
    # each chart is drawn: an SVG of real size holding many drawn paths, with its caption under it
    charts = page.locator("figure.chart")
    assert await charts.count() == 3
    for i in range(3):
        figure = charts.nth(i)
        box = await figure.locator("svg").bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 100, box
        assert await figure.locator("svg path").count() > 20
        assert await figure.locator("figcaption").inner_text()
    kinds = [await charts.nth(i).get_attribute("data-kind") for i in range(3)]
    assert kinds == ["intervals", "heatmap", "memory"]
    # the chart sits under its own ticket, the crashed cell reads as a finding
    tickets_text = await page.locator("section#tickets").inner_text()
    assert tickets_text.index("Ticket 4: MTP align tax fix") < tickets_text.index(
        "Ticket 4: each gate's rounds"
    )
    assert (
        "crashed: server OOM-killed at 64K (the wall)" in await page.locator("section#campaigns").inner_text()
    )
    # no broken images: every <img> (there should be none) loaded
    broken = await page.evaluate(
        "[...document.images].filter(i => !i.complete || i.naturalWidth === 0).length"
    )
    assert broken == 0
    assert not visit.off_host(), visit.off_host()
    assert not visit.failed, visit.failed
    assert not visit.console_errors, visit.console_errors


async def test_html_report_file_in_chromium(
    browser_context: Any, visit: Visit, sqlite_engine: Engine, tmp_path: Path
) -> None:
    since = fill(sqlite_engine, tmp_path / "artifacts")
    with session_scope(sqlite_engine) as session:
        path = tmp_path / "report.html"
        path.write_text(render_html(build_report(session=session, since=since)))
    await offline(browser_context, visit)
    page = await browser_context.new_page()
    watch(page, visit)
    await page.goto(path.as_uri())
    await check_report_page(page, visit)
    assert visit.requests == [path.as_uri()], "the file needs nothing but itself"
    # it prints: Chromium lays it out as a PDF of a few pages
    pdf = await page.pdf(format="A4")
    assert pdf.startswith(b"%PDF") and len(pdf) > 20_000


async def test_report_served_by_the_api_in_chromium(
    browser_context: Any, visit: Visit, sqlite_engine: Engine, tmp_path: Path
) -> None:
    fill(sqlite_engine, tmp_path / "artifacts")
    await offline(browser_context, visit)
    with serving(sqlite_engine, TOKENS) as base:
        page = await browser_context.new_page()
        watch(page, visit)
        refused = await page.goto(f"{base}/report")
        assert refused is not None and refused.status == 401
        visit.console_errors.clear()  # the 401 above is Chromium's one expected console error
        await page.set_extra_http_headers({"Authorization": f"Bearer {WAYNE}"})
        response = await page.goto(f"{base}/report?since=6h")
        assert response is not None and response.status == 200
        await check_report_page(page, visit)


async def test_api_docs_render_offline(browser_context: Any, visit: Visit, sqlite_engine: Engine) -> None:
    await offline(browser_context, visit)
    with serving(sqlite_engine, TOKENS) as base:
        page = await browser_context.new_page()
        watch(page, visit)
        await page.goto(f"{base}/docs")
        title = page.locator(".swagger-ui .info .title")
        await title.wait_for(timeout=20_000)
        assert "Daedalus" in await title.inner_text()
        operations = page.locator(".opblock-summary-path")
        await operations.first.wait_for()
        paths = {(await operations.nth(i).inner_text()).strip() for i in range(await operations.count())}
        assert {"/tickets", "/decisions", "/audit", "/report"} <= {p.replace("\u200b", "") for p in paths}, (
            paths
        )
        # the static assets come from the installed package, not a CDN
        assert any("/static-offline-docs/swagger-ui-bundle.js" in url for url in visit.requests)
    assert not visit.off_host(), f"the docs asked the network for {visit.off_host()}"
    assert not visit.failed, visit.failed


HOSTILE = (
    "![pixel](https://tracker.example/p.png) [click](https://phish.example/login) <https://auto.example/x> "
    '<img src="https://raw.example/i.png"> <script>alert(1)</script>'
)


def plant_hostile_text(engine: Engine, since_hours: int = 1) -> None:
    """A filer's title and a person's lesson holding Markdown and HTML that would load or link outside."""
    now = datetime.now(UTC)
    snapshot = TicketSnapshot(
        ticket_id="hostile", workflow_id="ticket-hostile", run_id="run-hostile", title=f"fix {HOSTILE}"[:200],
        parent=None, kind="fix", host="mavis", engine="1cat-vllm", agent="codex", status="awaiting_approval",
        attempts=0, awaiting="wayne", outcome_reason="",
    )  # fmt: skip
    event = AuditEvent(
        workflow_id="ticket-hostile", run_id="run-hostile", seq=1, ticket_id="hostile", kind=AuditKind.FILED,
        actor="mallory", at=now - timedelta(minutes=5), status="awaiting_approval", summary=f"filed: {HOSTILE}",
    )  # fmt: skip
    lesson = Lesson(
        subject_kind=SubjectKind.ENGINE, subject="1cat-vllm", kind=LessonKind.TRAP, text=HOSTILE,
        source="mallory", recorded_by="mallory", recorded_at=now - timedelta(minutes=4),
    )  # fmt: skip
    with session_scope(engine) as session:
        apply(session=session, record=AuditRecord(event=event, ticket=snapshot), key=TEST_AUDIT_KEY)
        lessons.record(session=session, lesson=lesson)


async def test_stored_markdown_cannot_make_the_report_load_or_link_anything(
    browser_context: Any, visit: Visit, sqlite_engine: Engine, tmp_path: Path
) -> None:
    """Titles, summaries and lessons are other people's text: in the HTML report they load nothing, link
    nowhere and run nothing, from a file and from /report (whose CSP header forbids it as well)."""
    since = fill(sqlite_engine, tmp_path / "artifacts")
    plant_hostile_text(sqlite_engine)
    with session_scope(sqlite_engine) as session:
        text = render_html(build_report(session=session, since=since))
    assert "tracker.example" in text  # the text is shown, as text
    for tag in ("<img", "<script", "<a "):
        assert tag not in text, tag
    path = tmp_path / "report.html"
    path.write_text(text)
    page = await browser_context.new_page()  # no `offline` routing: a fetch would really be attempted
    watch(page, visit)
    await page.goto(path.as_uri())
    assert await page.locator("img").count() == 0 and await page.locator("a[href]").count() == 0
    assert "tracker.example/p.png" in await page.locator("section#lessons").inner_text()
    assert not visit.off_host(), visit.off_host()
    with serving(sqlite_engine, TOKENS) as base:
        response = await httpx.AsyncClient().get(
            f"{base}/report", params={"since": "6h"}, headers={"Authorization": f"Bearer {WAYNE}"}
        )
    assert response.status_code == 200 and "<img" not in response.text
    assert "default-src 'none'" in response.headers["content-security-policy"]
