"""`daedalus hosts`: each host's workers, last check, leases, tenants and constraints; tenant demand; lifting
constraints."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from daedalus.cli import _common
from daedalus.cli._common import client, console, fail, run
from daedalus.config import Settings
from daedalus.hosts.registry import Registry, RegistryError, load_registry
from daedalus.hosts.status import HostView, describe_hosts
from daedalus.schemas.host_check import CheckStatus, HostCheckRecord

app = typer.Typer(
    help="Hosts: workers polling, GPU leases, tenants, standing constraints.", no_args_is_help=False
)


def _registry(settings: Settings) -> Registry:
    try:
        return load_registry(settings.hosts_file)
    except RegistryError as error:
        fail(str(error))


def _ago(at: datetime | None, now: datetime) -> str:
    if at is None:
        return "-"
    seconds = (now - at).total_seconds()
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{at.astimezone(UTC):%H:%M:%S} UTC"


def _show(view: HostView, now: datetime) -> None:
    host, queue, keeper = view.host, view.queue, view.keeper
    gpus = host.gpus
    memory = f"{gpus.memory_gib:g} GiB{' unified' if gpus.unified else ''}"
    kind = " (simulated)" if gpus.simulated else ""
    console.print(
        f"[bold]{escape(host.name)}[/bold]  {gpus.count}x {escape(gpus.model)}, {memory}{kind}  queue {queue.queue}"
    )
    live = queue.live_pollers(now)
    if queue.error:
        console.print(f"  workers: [red]{escape(queue.error)}[/red]")
    elif live:
        seen = ", ".join(f"{escape(p.identity)} ({_ago(p.last_seen, now)})" for p in live)
        console.print(f"  workers: {len(live)} polling: {seen}")
    else:
        last = max((p.last_seen for p in queue.pollers if p.last_seen), default=None)
        console.print(
            f"  workers: [red]none polling[/red] (last seen {_ago(last, now)}); "
            f"run `daedalus worker --host {escape(host.name)}` there"
        )
    for mirror in host.engines:
        console.print(f"  engine {escape(mirror.name)}: mirror of {escape(mirror.url)}")
    if queue.backlog is not None:
        age = f", oldest {queue.backlog_age_s:.0f}s" if queue.backlog_age_s else ""
        console.print(f"  backlog: {queue.backlog} task(s){age}")
    if keeper is None:
        console.print(f"  leases: [yellow]{escape(view.keeper_error)}[/yellow]")
        return
    _show_check(keeper.last_check, host.name, now)
    table = Table(show_edge=False, pad_edge=False)
    for column in ("lease", "state", "GPUs", "priority", "holder", "since"):
        table.add_column(column)
    for lease in keeper.held:
        state = "revoked" if lease.revoked else "held"
        table.add_row(
            escape(lease.lease_id),
            state,
            ",".join(map(str, lease.gpus)),
            str(lease.priority),
            escape(lease.holder),
            _ago(lease.granted_at, now),
        )
    for waiting in keeper.waiting:
        request = waiting.request
        gpus_asked = ",".join(map(str, request.gpus)) if request.gpus else f"any {request.count}"
        table.add_row(
            escape(request.lease_id),
            "waiting",
            gpus_asked,
            str(request.priority),
            escape(request.holder),
            _ago(waiting.requested_at, now),
        )
    if keeper.held or keeper.waiting:
        console.print(table)
    else:
        console.print("  leases: none held, none waiting")
    for tenant in keeper.tenants:
        busy = ", its own work running" if tenant.busy else ""
        console.print(
            f"  tenant {escape(tenant.spec.name)}: {tenant.mode.value}{busy} on GPUs {tenant.spec.gpus} "
            f"(priority {tenant.spec.priority}; paused {tenant.pauses}x, resumed {tenant.resumes}x)"
            + (f" — {escape(tenant.last_check)}" if tenant.last_check else "")
        )
    for constraint in keeper.live_constraints():
        console.print(f"  constraint: {escape(constraint.describe())}")
    c = keeper.counters
    console.print(
        f"  totals: {c.granted} granted, {c.released} released, {c.expired} expired, {c.refused} refused, "
        f"{c.revoked} revoked"
    )


def _show_check(record: HostCheckRecord | None, host: str, now: datetime) -> None:
    """The host's last check of itself (sent by its worker at start, kept by its lease keeper)."""
    if record is None:
        console.print(f"  check: none yet (`daedalus worker --host {escape(host)}` sends one as it starts)")
        return
    check = record.check
    colour = "green" if check.ok else "red"
    console.print(
        f"  check: [{colour}]{escape(check.summary())}[/{colour}] {_ago(record.received_at, now)} "
        f"by {escape(check.checked_by)}"
    )
    for line in check.lines:
        if line.status in (CheckStatus.FAIL, CheckStatus.WARN):
            fix = f" — fix: {escape(line.fix)}" if line.fix else ""
            console.print(
                f"    {line.status.value} {escape(line.name)}: {escape(line.detail)}{fix}", soft_wrap=True
            )


@app.callback(invoke_without_command=True)
def hosts(
    context: typer.Context,
    host: Annotated[str | None, typer.Option(help="only this host")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the views as JSON")] = False,
) -> None:
    """Each host in hosts.yaml: workers polling its queue, last seen, leases held and waiting, tenants."""
    if context.invoked_subcommand is not None:
        return
    settings = _common.settings()
    registry = _registry(settings)
    if host is not None:
        try:
            registry = Registry(hosts=[registry.host(host)], constraints=registry.constraints)
        except RegistryError as error:
            fail(str(error))

    async def go() -> list[HostView]:
        return await describe_hosts(await client(settings), registry, settings.temporal.namespace)

    views = run(go())
    if as_json:
        console.print_json(json.dumps([v.model_dump(mode="json") for v in views]))
        return
    now = datetime.now(UTC)
    for view in views:
        _show(view, now)


@app.command()
def tenant(
    name: Annotated[str, typer.Argument(help="the tenant, as hosts.yaml names it")],
    host: Annotated[str, typer.Option(help="its host")],
    busy: Annotated[bool, typer.Option("--busy/--idle", help="its own work arrived / ended")] = True,
) -> None:
    """Tell the keeper a tenant's own work arrived (revokes lower-priority leases on its GPUs) or ended."""
    from daedalus.hosts import holder

    settings = _common.settings()
    try:
        _registry(settings).host(host)
    except RegistryError as error:
        fail(str(error))

    async def go() -> list[str]:
        try:
            return await holder.tenant_demand(await client(settings), host, name, busy=busy)
        except holder.LeaseError as error:
            fail(str(error))

    revoked = run(go())
    console.print(
        f"tenant {escape(name)} on {escape(host)}: {'busy' if busy else 'idle'}; revoked: {revoked or 'none'}"
    )


@app.command()
def lift(ticket: Annotated[str, typer.Option(help="the ticket that passed")]) -> None:
    """Lift now the standing constraints bound to a ticket that passed (keepers also see it in the store)."""
    from daedalus.hosts import holder

    settings = _common.settings()
    registry = _registry(settings)

    async def go() -> None:
        await holder.ticket_passed(await client(settings), registry, ticket)

    run(go())
    console.print(f"constraints bound to ticket {escape(ticket)} lifted on {', '.join(registry.names)}")
