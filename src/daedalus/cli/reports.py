"""`daedalus report-schedule`: post a short report digest with a link to Slack on a Temporal schedule."""

from __future__ import annotations

from typing import Annotated

import typer

from daedalus.cli import _common
from daedalus.cli._common import client, console, fail, run


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
