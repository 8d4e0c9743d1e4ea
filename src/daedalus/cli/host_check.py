"""`daedalus host check`: can this host do its job? One line per check, each failure with its fix."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from daedalus.cli import _common
from daedalus.cli._common import console, run
from daedalus.config import Settings
from daedalus.ids import host_queue
from daedalus.schemas.host_check import CheckStatus, HostCheck

STYLE = {
    CheckStatus.OK: "green",
    CheckStatus.WARN: "yellow",
    CheckStatus.FAIL: "red",
    CheckStatus.SKIP: "dim",
}


def show(check: HostCheck) -> None:
    table = Table(title=f"host {escape(check.host)}: {check.summary()}", show_edge=False, pad_edge=False)
    for column in ("check", "status", "what it saw", "fix"):
        table.add_column(column, overflow="fold")
    for line in check.lines:
        style = STYLE[line.status]
        table.add_row(
            escape(line.name),
            f"[{style}]{line.status.value}[/{style}]",
            escape(line.detail),
            escape(line.fix),
        )
    console.print(table)


def check(
    host: Annotated[str | None, typer.Option(help="the host to check (default: DAEDALUS_HOST)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the check as JSON")] = False,
    send: Annotated[
        bool, typer.Option(help="keep the check at the host's lease keeper, and read Temporal's clock there")
    ] = True,
) -> None:
    """Check this host before it takes work: packages, sandbox, GPUs, engine builds, Temporal, disk, clock.

    Exit 1 when a check failed (`daedalus worker` would not poll this host's queue)."""
    from daedalus.hosts.check import check_host

    settings = _common.settings()
    name = host or settings.host
    result = run(check_host(settings, name, send=send))
    if as_json:
        console.print_json(json.dumps(result.model_dump(mode="json")))
    else:
        show(result)
    if not result.ok:
        raise typer.Exit(1)


def serveable(settings: Settings, hosts: list[str]) -> list[str]:
    """`daedalus worker`'s check at start: the hosts whose check passed; each failed one is shown with its fixes
    and its queue is not polled."""
    from daedalus.hosts.check import check_host

    passed = []
    for name in hosts:
        result = run(check_host(settings, name))
        if result.ok:
            passed.append(name)
            console.print(f"host {escape(name)}: check {escape(result.summary())}")
            continue
        show(result)
        console.print(
            f"[red]not polling {escape(host_queue(name))}[/red]: host {escape(name)} failed its check; fix what "
            f"it says, then start the worker again (`daedalus host check --host {escape(name)}` checks again)"
        )
    return passed
