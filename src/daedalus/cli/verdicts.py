"""`daedalus verdict ...`: a stored verdict, re-derived from the store alone."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from daedalus.cli._common import console, fail, store
from daedalus.escaping import for_terminal
from daedalus.gates.verdicts import rederive as rederive_result
from daedalus.schemas.gates import GateResult
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.store.tables import VerdictRow

app = typer.Typer(no_args_is_help=True, help="Stored gate verdicts.")


def stored_result(row: VerdictRow) -> GateResult:
    """The GateResult a verdict row was written from."""
    fields = set(GateResult.model_fields)
    return GateResult.model_validate({k: v for k, v in row.model_dump().items() if k in fields})


def _interval(result: GateResult) -> str:
    if result.ci_low is None or result.ci_high is None:
        return f"none ({result.rounds_needed} more rounds needed)" if result.rounds_needed else "none"
    return f"[{result.ci_low:.6g}, {result.ci_high:.6g}]"


@app.command()
def rederive(
    verdict_id: Annotated[
        int, typer.Argument(help="the verdict's id in the store (see `daedalus ticket show`)")
    ],
) -> None:
    """Recompute a verdict from its stored gate spec and samples; exit 1 if it comes out different."""
    with session_scope(store()) as session:
        row = queries.verdict(session=session, verdict_id=verdict_id)
        if row is None:
            fail(f"no verdict with id {verdict_id} in the store")
        try:
            stored = stored_result(row)
        except ValidationError as error:
            fail(f"verdict {verdict_id} does not read back as a gate result: {error}")
        ticket, attempt = row.ticket_id, row.attempt
    try:
        again = rederive_result(stored)
    except ValueError as error:
        fail(str(error))
    table = Table("", "stored", "re-derived", title=f"verdict {verdict_id}: ticket {ticket}, attempt {attempt}, "
                  f"gate {for_terminal(stored.gate)}")  # fmt: skip
    rows = [
        ("verdict", stored.verdict.value, again.verdict.value),
        ("median", f"{stored.median}", f"{again.median}"),
        (f"{stored.confidence:.0%} interval", _interval(stored), _interval(again)),
        ("method", stored.method, again.method),
    ]
    for name, before, after in rows:
        table.add_row(name, for_terminal(before), for_terminal(after))
    console.print(table)
    if stored.provenance is not None:
        p = stored.provenance
        console.print(
            f"measured: {p.engine} {p.engine_build[:16]}, preset {p.preset}"
            + (f" vs {p.baseline_preset}" if p.baseline_preset else "")
            + f", model {for_terminal(p.model)} ({(p.model_sha256 or 'no hash')[:16]}), host {p.host}, "
            f"commit {p.commit[:10] or '-'}; raw data: {for_terminal(p.artifacts)}"
        )
    same = (stored.verdict, stored.median, stored.ci_low, stored.ci_high) == (
        again.verdict, again.median, again.ci_low, again.ci_high,
    )  # fmt: skip
    if not same:
        console.print("[red]the re-derived verdict differs from the stored one[/red]")
        raise typer.Exit(1)
    console.print("[green]re-derived from the store: the same verdict[/green]")


@app.command("list")
def list_verdicts(ticket: Annotated[str, typer.Option(help="the ticket id")]) -> None:
    """A ticket's stored verdicts with their ids, oldest first."""
    with session_scope(store()) as session:
        rows = queries.verdicts(session=session, ticket_id=ticket)
        table = Table("id", "attempt", "gate", "verdict", "median", "interval", "rule", "recorded")
        for row in rows:
            result = stored_result(row)
            median = f"{result.median:.4g}" if result.median is not None else ""
            table.add_row(str(row.id), str(row.attempt), for_terminal(row.gate), row.verdict, median,
                          for_terminal(_interval(result)), for_terminal(row.rule), f"{row.recorded_at:%Y-%m-%d %H:%M}")  # fmt: skip
    console.print(table)
