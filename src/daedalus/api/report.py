"""/report: the latest progress report, rolled up from the store at request time (HTML or Markdown)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from daedalus.api.context import ApiContext, Caller, Context
from daedalus.api.hosts import waiting_lines
from daedalus.report import build_report, render_html, render_markdown
from daedalus.report.i18n import LANGUAGES, UnknownLanguage, check_language
from daedalus.report.render import CONTENT_SECURITY_POLICY
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.store.tables import TicketRow

router = APIRouter(tags=["report"])
MAX_WINDOW = timedelta(days=366)


WINDOW = re.compile(r"^(?P<number>[0-9]{1,9})(?P<unit>[mhd])$")
"""ASCII digits only (`²` is a digit to str.isdigit), and few enough that the product cannot overflow."""
UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400}


def parse_window(text: str) -> timedelta:
    """`30m`, `24h`, `7d` -> a timedelta; anything else is refused with the accepted forms."""
    match = WINDOW.match(text)
    if match is None or int(match["number"]) < 1:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"since={text!r} is not a window; use a number with m, h or d (30m, 24h, 7d)",
        )
    seconds = int(match["number"]) * UNIT_SECONDS[match["unit"]]
    if seconds > MAX_WINDOW.total_seconds():
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"since={text!r} is longer than 366 days")
    return timedelta(seconds=seconds)


@router.get(
    "/report",
    response_class=HTMLResponse,
    responses={200: {"content": {"text/html": {}, "text/markdown": {}}}},
)
async def report(
    _: Caller,
    context: Context,
    since: Annotated[str, Query(description="the window: 30m, 24h, 7d")] = "24h",
    format: Annotated[Literal["html", "md"], Query(description="html (charts inline) or md")] = "html",
    lang: Annotated[str, Query(description=f"the report's language: {', '.join(LANGUAGES)}")] = "en",
) -> Response:
    """The progress report as of now: cards, tickets and gates, campaigns, training runs, decisions, lessons."""
    return await report_response(context, since, format, lang)


async def report_response(
    context: ApiContext, since: str, format: Literal["html", "md"], lang: str = "en"
) -> Response:
    """The report over the window `since` in `lang`, as the API and the console serve it (with its own CSP)."""
    try:
        check_language(lang)
    except UnknownLanguage as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"lang={lang!r}: {error}") from error
    start = datetime.now(UTC) - parse_window(since)

    def live_tickets() -> list[TicketRow]:
        with session_scope(context.engine) as session:
            return list(queries.list_tickets(session=session, limit=1000))

    waiting = await waiting_lines(context, await asyncio.to_thread(live_tickets))

    def render() -> str:
        with session_scope(context.engine) as session:
            built = build_report(session=session, since=start, waiting_on_hosts=waiting, lang=lang)
        return render_html(built) if format == "html" else render_markdown(built)

    text = await asyncio.to_thread(render)
    headers = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff"}
    if format == "md":
        return PlainTextResponse(text, media_type="text/markdown; charset=utf-8", headers=headers)
    return HTMLResponse(text, headers=headers)
