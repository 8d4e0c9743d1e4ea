"""`daedalus audit` (the trail from the store) and `daedalus audit verify` (that nobody tampered with it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from daedalus.cli._common import client, console, parse_since, run, settings, store
from daedalus.cli.clients import stack_client
from daedalus.errors import RequestRefused
from daedalus.escaping import for_terminal as shown

if TYPE_CHECKING:
    from daedalus.api.models import AuditEventPublic
    from daedalus.services.audit import Verification


audit_app = typer.Typer(
    help="The audit trail from the store (`daedalus audit verify` checks it was not tampered with).",
    invoke_without_command=True,
)


@audit_app.callback()
def audit(
    context: typer.Context,
    ticket: Annotated[str | None, typer.Option(help="only this ticket (or training-<name>)")] = None,
    actor: Annotated[str | None, typer.Option(help="only events by this person or agent")] = None,
    since: Annotated[str | None, typer.Option(help="ISO time, or a duration like 2h / 3d")] = None,
    limit: int = 1000,
) -> None:
    """The audit trail from the store: one line per transition, oldest first."""
    if context.invoked_subcommand is not None:
        return
    since_at = parse_since(since) if since else None
    print_audit(stack_client().audit(ticket, actor, since_at, limit))


def print_audit(events: Sequence[AuditEventPublic]) -> None:
    from rich.table import Table

    table = Table("at", "ticket", "#", "kind", "actor", "status", "summary")
    for event in events:
        table.add_row(
            f"{event.at:%H:%M:%S}",
            shown(event.ticket_id),
            str(event.seq),
            shown(event.kind),
            shown(event.actor),
            shown(event.status),
            shown(event.summary),
        )
    console.print(table)


@audit_app.command("verify")
def verify_audit(
    ticket: Annotated[list[str] | None, typer.Option(help="only these tickets' trails (repeatable)")] = None,
) -> None:
    """Recompute every trail's hash chain and seals, and hold each trail to its workflow's own count of it in
    Temporal; name the first event changed, deleted, reordered, forged or cut off (exit 1)."""
    from daedalus.services.audit import verify

    key = settings().audit_key(create=False)

    async def go() -> Verification:
        try:
            temporal = await client()
        except RequestRefused as error:
            found = await verify(store(), key, None, ticket)
            found.unanchored = [f"Temporal is unreachable ({error})"]
            return found
        return await verify(store(), key, temporal, ticket, control_queue=settings().temporal.control_queue)

    result = run(go())
    if key is None:
        console.print(
            "[yellow]no audit key here (DAEDALUS_AUDIT_KEY / DAEDALUS_AUDIT_KEY_FILE): seals not checked[/yellow]"
        )
    for why in result.unanchored[:5]:
        console.print(f"[yellow]not held against Temporal: {shown(why)}[/yellow]")
    if not result.breaks:
        console.print(
            f"audit trail verified: {result.events} events, every chain and seal intact; "
            f"{result.anchored} trail(s) held against their workflows in Temporal"
        )
        return
    for found in result.breaks:
        console.print(f"[red]{found.kind.value}[/red] {shown(found.ticket_id)}: {shown(found.message)}")
    console.print(f"{len(result.breaks)} trail(s) of {result.events} events do not verify")
    raise typer.Exit(1)
