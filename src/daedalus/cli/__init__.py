"""The `daedalus` command: one typer app, one sub-app per domain."""

from __future__ import annotations

import os
import sys

import typer

from daedalus.cli import (
    api,
    campaigns,
    demo,
    engines,
    host_bundle,
    hosts,
    lessons,
    reports,
    stack,
    tickets,
    tokens,
    training,
    verdicts,
)
from daedalus.cli._common import settings
from daedalus.logs import configure_logging

app = typer.Typer(
    name="daedalus",
    help="Durable, auditable tickets for an ML-inference team, on Temporal.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _settings() -> None:
    """Durable, auditable tickets for an ML-inference team, on Temporal."""
    settings.cache_clear()  # built afresh for each invocation (in-process runners invoke the app many times)
    settings()  # once, before any command: a bad DAEDALUS_* value stops here with its name


app.command()(stack.up)
app.command()(stack.worker)
app.command()(tickets.decide)
app.command()(tickets.delegate)
app.add_typer(tickets.audit_app, name="audit")
app.command()(tickets.report)
app.command("report-schedule")(reports.report_schedule)
app.command()(demo.demo)
tickets.app.command()(tickets.draft)
app.add_typer(tickets.app, name="ticket")
app.add_typer(engines.app, name="engine")
app.add_typer(training.app, name="train")
app.add_typer(api.app, name="api")
app.add_typer(tokens.app, name="token")
app.add_typer(hosts.app, name="hosts")
app.add_typer(host_bundle.app, name="host")
app.add_typer(lessons.app, name="lessons")
app.add_typer(campaigns.app, name="campaign")
app.add_typer(verdicts.app, name="verdict")


def main() -> None:
    configure_logging()
    try:
        app()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    # Skip interpreter teardown: the Temporal client's Rust threads can abort a finalizing interpreter
    # ("PyGILState_Release ... finalizing", temporalio/sdk-python#300), turning a finished command into exit -6.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
