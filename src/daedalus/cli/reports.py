"""`daedalus report` (the progress report from the store) and `daedalus report-schedule` (a digest posted to
Slack on a Temporal schedule)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from daedalus.cli import _common
from daedalus.cli._common import client, console, fail, parse_since, run, store, waiting_on_hosts


def report_schedule(
    every: Annotated[str, typer.Option(help="how often: 30m, 12h, 1d")] = "1d",
    window: Annotated[str, typer.Option(help="what each digest covers: 24h, 7d")] = "24h",
    link: Annotated[
        str, typer.Option(help="the full report's URL, e.g. https://daedalus.example/report")
    ] = "",
) -> None:
    """Create (or update) the schedule; the control worker writes the HTML report and posts the summary."""
    from daedalus.api.report import parse_window
    from daedalus.schemas.report import DigestInput
    from daedalus.services.report_schedule import ensure_digest_schedule

    try:
        interval, covered = parse_window(every), parse_window(window)
    except Exception as error:  # parse_window speaks HTTP; say the same here
        fail(str(getattr(error, "detail", error)).replace("since=", "").replace("a window", "a duration"))
    settings = _common.settings()

    async def create() -> str:
        handle = await ensure_digest_schedule(
            await client(settings),
            control_queue=settings.temporal.control_queue,
            every=interval,
            request=DigestInput(window_hours=covered.total_seconds() / 3600, link=link),
        )
        return handle.id

    try:
        schedule_id = run(create())
    except ValueError as error:
        fail(str(error))
    console.print(
        f"schedule {schedule_id}: a digest of the last {window} every {every}"
        + (f", linking {link}" if link else "")
    )


def report(
    since: Annotated[str, typer.Option(help="ISO time, or a duration like 24h / 3d")] = "24h",
    out: Annotated[Path | None, typer.Option("-o", "--out", help="write the markdown here")] = None,
    html: Annotated[
        Path | None, typer.Option("--html", help="also write a self-contained HTML page (charts inline) here")
    ] = None,
    narrate: Annotated[
        bool, typer.Option(help="open with the lead agent's narrative (needs an API key)")
    ] = False,
    lang: Annotated[
        str, typer.Option("--lang", help="the report's language: en or zh-TW (Traditional Chinese)")
    ] = "en",
) -> None:
    """The progress report, rolled up from the store: cards, tickets and gates, campaigns, training, decisions.
    Printed as Markdown unless -o writes it to a file; --html writes the HTML page besides."""
    from rich.markdown import Markdown

    from daedalus.report import build_report, render_html, render_markdown
    from daedalus.report.i18n import UnknownLanguage, check_language
    from daedalus.store import queries
    from daedalus.store.database import session_scope

    try:
        check_language(lang)
    except UnknownLanguage as error:
        fail(f"--lang: {error}")
    for target in (out, html):
        if target is not None and not target.parent.is_dir():
            fail(f"cannot write {target}: directory {target.parent} does not exist")
    with session_scope(store()) as session:
        waiting = waiting_on_hosts(queries.list_tickets(session=session, limit=1000))
        built = build_report(session=session, since=parse_since(since), waiting_on_hosts=waiting, lang=lang)
    if narrate:
        from daedalus.agents.lead import LeadAgent

        narrative = run(LeadAgent(_common.settings().agent).narrative(built.facts()))
        built.narrative, built.narrative_note = narrative.lines, narrative.note
    text = render_markdown(built)
    if html is not None:
        html.write_text(render_html(built))
        console.print(f"HTML report written to {html}")
    if out is not None:
        out.write_text(text)
        console.print(f"report written to {out}")
    else:
        console.print(Markdown(text))
