"""`daedalus ticket ...`, `daedalus decide`, `daedalus delegate` and `daedalus audit`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from pydantic import BaseModel, ValidationError
from rich.markdown import Markdown
from rich.table import Table

from daedalus import services as tickets
from daedalus.cli._common import client, console, fail, run, settings, store, waiting_on_hosts
from daedalus.escaping import for_terminal as shown
from daedalus.hosts.registry import RegistryError, load_registry
from daedalus.schemas.ticket import (
    CancelRequest,
    Decision,
    DecisionKind,
    Delegation,
    SpecAmendment,
    TicketState,
)
from daedalus.services import TicketError
from daedalus.store import chain, queries
from daedalus.store.database import session_scope
from daedalus.store.tables import AuditEventRow

M = TypeVar("M", bound=BaseModel)

app = typer.Typer(help="File, list, inspect, amend and cancel tickets.", no_args_is_help=True)


def _model(build: type[M], **values: Any) -> M:
    try:
        return build(**values)
    except ValidationError as error:
        fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()))


@app.command()
def create(
    file: Annotated[Path, typer.Option("-f", "--file", help="ticket spec (YAML or JSON)")],
    filed_by: Annotated[str, typer.Option("--as", help="who files it")] = "cli",
) -> None:
    """File a ticket: validates the whole spec first, then starts workflow ticket-<id>."""
    try:
        spec = tickets.load_spec(file)
    except TicketError as error:
        fail(str(error))
    temporal = settings().temporal
    try:
        hosts = load_registry(settings().hosts_file)
    except RegistryError as error:
        fail(str(error))

    async def go() -> str:
        handle = await tickets.file_ticket(
            await client(), spec, queue=temporal.control_queue, filed_by=filed_by, hosts=hosts
        )
        return handle.id

    workflow_id = run(go())
    console.print(f"filed ticket [bold]{shown(spec.id)}[/bold] as workflow {shown(workflow_id)}")
    console.print(
        f"  watch: daedalus ticket show {spec.id}   UI: http://localhost:{temporal.ui_port}/namespaces/{temporal.namespace}/workflows/{workflow_id}"
    )


@app.command("list")
def list_(status: Annotated[str | None, typer.Option(help="only tickets in this status")] = None) -> None:
    """Tickets from the store's projection, newest first."""
    with session_scope(store()) as session:
        rows = queries.list_tickets(session=session, status=status)
        table = Table("ticket", "title", "status", "host", "agent", "attempts", "awaiting", "updated")
        for row in rows:
            table.add_row(
                shown(row.ticket_id),
                shown(row.title[:50]),
                shown(row.status),
                shown(row.host),
                shown(row.agent or "-"),
                str(row.attempts),
                shown(row.awaiting or ""),
                f"{row.updated_at:%Y-%m-%d %H:%M:%S}",
            )
        waiting = waiting_on_hosts(rows)
    console.print(table)
    for ticket_id, line in waiting.items():
        console.print(f"[yellow]ticket {shown(ticket_id)}: {shown(line)}[/yellow]")


@app.command()
def show(ticket_id: str) -> None:
    """Status, attempts, verdicts and the pending decision of one ticket."""

    async def go() -> TicketState:
        return await tickets.status(await client(), ticket_id)

    state = run(go())
    with session_scope(store()) as session:
        row = queries.get_ticket(session=session, ticket_id=ticket_id)
        waiting = waiting_on_hosts([row]) if row is not None and row.status == state.status.value else {}
    print_state(state, waiting.get(ticket_id))


def print_state(state: TicketState, waiting_on_host: str | None = None) -> None:
    spec = state.spec
    console.print(f"[bold]ticket {shown(spec.id)}[/bold]: {shown(spec.title)}  \\[{state.status.value}]")
    console.print(
        f"  host {shown(spec.host)}, agent {spec.agent.name.value if spec.agent else '-'}, "
        f"max attempts {spec.max_attempts}"
    )
    if state.outcome_reason:
        console.print(f"  outcome: {shown(state.outcome_reason)}")
    if waiting_on_host:
        console.print(f"  [yellow]{shown(waiting_on_host)}[/yellow]")
    for child, status in state.children.items():
        console.print(f"  sub-ticket {shown(child)}: {status.value}")
    if state.attempts:
        table = Table("attempt", "outcome", "commit", "gate", "verdict", "median", "90% CI", "rule")
        for attempt in state.attempts:
            head = [str(attempt.number), attempt.outcome.value, shown((attempt.commit or "-")[:10])]
            if not attempt.gate_results:
                table.add_row(*head, "-", "-", "", "", shown(attempt.detail[:80]))
            for result in attempt.gate_results:
                interval = f"[{result.ci_low:.4g}, {result.ci_high:.4g}]" if result.ci_low is not None else ""
                median = f"{result.median:.4g}" if result.median is not None else ""
                table.add_row(
                    *head,
                    shown(result.gate),
                    result.verdict.value,
                    median,
                    shown(interval),
                    shown(result.rule),
                )
        console.print(table)
    if state.pending_decision:
        request = state.pending_decision
        console.print(
            f"[yellow]waiting for a decision[/yellow] {shown(request.id)}: {shown(request.question)}"
        )
        console.print(
            f"  options: {shown(request.options)}; may decide: {shown(request.deciders + request.delegates)}"
        )
        console.print(
            shown(f"  answer:  daedalus decide {request.id} {request.options[0]} --as {request.deciders[0]}")
        )


@app.command()
def amend(
    ticket_id: str,
    who: Annotated[str, typer.Option("--as", help="who amends")],
    spec_text: Annotated[str | None, typer.Option("--spec", help="new brief text")] = None,
    constraint: Annotated[list[str] | None, typer.Option(help="replace the constraints (repeatable)")] = None,
    max_attempts: Annotated[int | None, typer.Option(min=1, max=10)] = None,
    note: str = "",
) -> None:
    """Change a live ticket's brief, constraints or attempt budget (applies from the next attempt)."""
    amendment = _model(
        SpecAmendment,
        amended_by=who,
        spec=spec_text,
        constraints=constraint,
        max_attempts=max_attempts,
        note=note,
    )

    async def go() -> TicketState:
        return await tickets.amend(await client(), ticket_id, amendment)

    print_state(run(go()))


@app.command()
def cancel(
    ticket_id: str,
    who: Annotated[str, typer.Option("--as", help="who cancels")],
    reason: Annotated[str, typer.Option(help="why")],
) -> None:
    """Cancel a live ticket; its running step and that step's processes on the host are stopped."""
    request = _model(CancelRequest, requested_by=who, reason=reason)

    async def go() -> TicketState:
        return await tickets.cancel(await client(), ticket_id, request)

    state = run(go())
    console.print(shown(f"ticket {ticket_id}: cancel requested by {who} (status now {state.status.value})"))


def decide(
    request_id: Annotated[str, typer.Argument(help="e.g. 4-dispatch-1 (see `daedalus ticket show`)")],
    option: Annotated[str, typer.Argument(help="one of the request's options")],
    who: Annotated[str, typer.Option("--as", help="who decides")],
    note: Annotated[str, typer.Option(help="reason, kept in the audit trail")] = "",
) -> None:
    """Answer a pending decision. Refused (and nothing written) for an unknown request, option or decider."""
    decision = _model(
        Decision, request_id=request_id, option=option, decided_by=who, note=note, channel="cli"
    )

    async def go() -> object:
        return await tickets.decide(await client(), decision, store=store())

    run(go())
    console.print(shown(f"{who} chose {option!r} for {request_id}"))


def delegate(
    ticket_id: str,
    to: Annotated[str, typer.Option(help="who may decide on your behalf")],
    who: Annotated[str, typer.Option("--as", help="the decider delegating")],
    kind: Annotated[DecisionKind, typer.Option(help="which decisions")] = DecisionKind.DISPATCH,
) -> None:
    """Let someone decide one kind of decision for a ticket ("the lead may dispatch on my behalf")."""
    delegation = _model(Delegation, granted_by=who, delegate=to, kind=kind)

    async def go() -> list[str]:
        return await tickets.delegate(await client(), ticket_id, delegation)

    people = run(go())
    console.print(shown(f"ticket {ticket_id}: {kind.value} decisions may now also be made by {people}"))


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
    with session_scope(store()) as session:
        events = queries.audit_events(
            session=session, ticket_id=ticket, actor=actor, since=since_at, limit=limit
        )
        print_audit(events)


def print_audit(events: Sequence[AuditEventRow]) -> None:
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


def parse_since(text: str) -> datetime:
    units = {"m": "minutes", "h": "hours", "d": "days"}
    if text[:-1].isdigit() and text[-1] in units:
        return datetime.now(UTC) - timedelta(**{units[text[-1]]: int(text[:-1])})
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        fail(f"--since {text!r} is neither an ISO time (2026-07-12T08:00) nor a duration (30m, 2h, 3d)")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def report(
    since: Annotated[str, typer.Option(help="ISO time, or a duration like 24h / 3d")] = "24h",
    out: Annotated[Path | None, typer.Option("-o", "--out", help="write the markdown here")] = None,
    html: Annotated[
        Path | None, typer.Option("--html", help="also write a self-contained HTML page (charts inline) here")
    ] = None,
    narrate: Annotated[
        bool, typer.Option(help="open with the lead agent's narrative (needs an API key)")
    ] = False,
) -> None:
    """The progress report, rolled up from the store: cards, tickets and gates, campaigns, training, decisions."""
    from daedalus.report import build_report, render_html, render_markdown

    for target in (out, html):
        if target is not None and not target.parent.is_dir():
            fail(f"cannot write {target}: directory {target.parent} does not exist")
    with session_scope(store()) as session:
        waiting = waiting_on_hosts(queries.list_tickets(session=session, limit=1000))
        built = build_report(session=session, since=parse_since(since), waiting_on_hosts=waiting)
    if narrate:
        from daedalus.agents.lead import LeadAgent

        narrative = run(LeadAgent(settings().agent).narrative(built.facts()))
        built.narrative, built.narrative_note = narrative.lines, narrative.note
    text = render_markdown(built)
    if html is not None:
        html.write_text(render_html(built))
        console.print(f"HTML report written to {html}")
    if out is not None:
        out.write_text(text)
        console.print(f"report written to {out}")
    elif html is None:
        console.print(Markdown(text))


def draft(
    request: Annotated[str, typer.Argument(help="the request in your words")],
    ticket_id: Annotated[str | None, typer.Option("--id", help="the ticket id to use")] = None,
    host: Annotated[str | None, typer.Option(help="the host to use")] = None,
    out: Annotated[Path | None, typer.Option("-o", "--out", help="write the draft YAML here")] = None,
) -> None:
    """The lead agent drafts a ticket spec from a short request; review it, then `ticket create -f`."""
    from daedalus.agents.lead import LeadAgent
    from daedalus.schemas.agents import SpecDraftRequest

    lessons: list[str] = []
    if host is not None:
        from daedalus.activities.lessons import lesson_lines
        from daedalus.schemas.lessons import LessonQuery

        lessons = lesson_lines(engine=store(), query=LessonQuery(host=host))
    drafted = run(
        LeadAgent(settings().agent).draft_spec(
            SpecDraftRequest(request=request, ticket_id=ticket_id, host=host, lessons=lessons)
        )
    )
    if drafted.spec_json is None:
        fail("the lead agent produced no valid spec:\n  " + "\n  ".join(drafted.problems))
    text = yaml.safe_dump(json.loads(drafted.spec_json), sort_keys=False)
    if out is None:
        console.print(text, highlight=False, markup=False)
    else:
        out.write_text(text)
        console.print(
            f"draft by {drafted.lead} written to {out}; review it, then: daedalus ticket create -f {out}"
        )


@audit_app.command("verify")
def verify_audit(
    ticket: Annotated[list[str] | None, typer.Option(help="only these tickets' trails (repeatable)")] = None,
) -> None:
    """Recompute every trail's hash chain; name the first event changed, deleted or reordered (exit 1)."""
    with session_scope(store()) as session:
        checked, breaks = chain.verify(session, ticket)
    if not breaks:
        console.print(f"audit trail verified: {checked} events, every chain intact")
        return
    for found in breaks:
        console.print(f"[red]{found.kind.value}[/red] {shown(found.ticket_id)}: {shown(found.message)}")
    console.print(f"{len(breaks)} trail(s) of {checked} events do not verify")
    raise typer.Exit(1)
