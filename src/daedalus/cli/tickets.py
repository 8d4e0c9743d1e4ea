"""`daedalus ticket create|list|show|amend|cancel|terminate|draft`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from daedalus.cli._common import (
    console,
    fail,
    lazy_module,
    run,
    settings,
    store,
    validated,
)
from daedalus.cli.clients import AS_HELP, stack_client
from daedalus.errors import RequestRefused
from daedalus.escaping import for_terminal as shown
from daedalus.schemas.ticket import (
    CancelRequest,
    SpecAmendment,
    TerminateRequest,
    TicketState,
)

if TYPE_CHECKING:
    from daedalus import services as tickets
else:  # loaded on first use: `ticket list` and `ticket show` start without the service layer
    tickets = lazy_module("daedalus.services")


app = typer.Typer(help="File, list, inspect, amend and cancel tickets.", no_args_is_help=True)


@app.command()
def create(
    file: Annotated[Path, typer.Option("-f", "--file", help="ticket spec (YAML or JSON)")],
    filed_by: Annotated[
        str | None, typer.Option("--as", help=f"{AS_HELP} (local, without a policy: `cli`)")
    ] = None,
) -> None:
    """File a ticket: validates the whole spec first, then starts workflow ticket-<id>."""
    try:
        spec = tickets.load_spec(file)
    except RequestRefused as error:
        fail(str(error))
    stack = stack_client()
    filed = stack.file_ticket(spec, stack.filer(filed_by))
    if filed.ui_url is None:  # filed through a shared stack's API: it says whom it took the token for
        console.print(
            f"filed ticket [bold]{shown(spec.id)}[/bold] as workflow {shown(filed.filed.workflow_id)} "
            f"by {shown(filed.filed.filed_by)}"
        )
        return
    console.print(f"filed ticket [bold]{shown(spec.id)}[/bold] as workflow {shown(filed.filed.workflow_id)}")
    console.print(f"  watch: daedalus ticket show {spec.id}   UI: {filed.ui_url}")


@app.command("list")
def list_(status: Annotated[str | None, typer.Option(help="only tickets in this status")] = None) -> None:
    """Tickets from the store's projection, newest first."""
    from rich.table import Table

    rows = stack_client().list_tickets(status)
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
    console.print(table)
    for row in rows:
        if row.waiting_on_host:
            console.print(f"[yellow]ticket {shown(row.ticket_id)}: {shown(row.waiting_on_host)}[/yellow]")


@app.command()
def show(ticket_id: str) -> None:
    """Status, what it runs, the pending decision with its evidence, and the attempts side by side."""
    view = stack_client().show_ticket(ticket_id)
    row = view.projection
    if view.live is not None:
        print_state(view.live, view.waiting_on_host, view.children_recorded)
    elif row is not None:
        console.print(
            f"[bold]ticket {shown(row.ticket_id)}[/bold]: {shown(row.title)}  \\[{shown(row.status)}]"
        )
        console.print(
            f"  (Temporal did not answer in time; this is the store's record as of {row.updated_at:%H:%M:%S})"
        )
        if row.waiting_on_host:
            console.print(f"  [yellow]{shown(row.waiting_on_host)}[/yellow]")


def print_state(
    state: TicketState, waiting_on_host: str | None = None, children_recorded: dict[str, str] | None = None
) -> None:
    """A ticket as `ticket show` prints it; `children_recorded` holds each sub-ticket's status from its own
    trail (the parent's record says `draft` for a child that is running)."""
    from rich.table import Table

    from daedalus.workflows.ticket_rules import tree_commands

    spec = state.spec
    console.print(f"[bold]ticket {shown(spec.id)}[/bold]: {shown(spec.title)}  \\[{state.status.value}]")
    console.print(
        f"  host {shown(spec.host)}, agent {spec.agent.name.value if spec.agent else '-'}, "
        f"max attempts {spec.max_attempts}, deciders {shown(', '.join(spec.approval.deciders))}"
    )
    if state.outcome_reason:
        console.print(f"  outcome: {shown(state.outcome_reason)}")
    if waiting_on_host:
        console.print(f"  [yellow]{shown(waiting_on_host)}[/yellow]")
    recorded = children_recorded or {}
    for child, status in state.children.items():
        console.print(f"  sub-ticket {shown(child)}: {shown(recorded.get(child, status.value))}")
    console.print("  runs (each confined: its own checkout, no secrets, no network but an agent's model):")
    for line in tree_commands(spec) or ["nothing on a host"]:
        console.print(f"    {shown(line)}", highlight=False, soft_wrap=True)
    if state.attempts:
        table = Table("", *(f"attempt {a.number}" for a in state.attempts), title="attempts side by side")
        table.add_row("outcome", *(a.outcome.value for a in state.attempts))
        table.add_row("commit", *(shown((a.commit or "-")[:10]) for a in state.attempts))
        gates = list(dict.fromkeys(r.gate for a in state.attempts for r in a.gate_results))
        for gate in gates:
            cells = []
            rule = ""
            for attempt in state.attempts:
                result = next((r for r in attempt.gate_results if r.gate == gate), None)
                if result is None:
                    cells.append("-")
                    continue
                rule = result.rule
                median = f" median {result.median:.4g}" if result.median is not None else ""
                interval = (
                    f" {result.confidence:.0%} CI [{result.ci_low:.4g}, {result.ci_high:.4g}]"
                    if result.ci_low is not None and result.ci_high is not None
                    else ""
                )
                cells.append(shown(f"{result.verdict.value}{median}{interval}"))
            table.add_row(shown(f"gate {gate}: {rule}"), *cells)
            loads = [
                next((r.host_load for r in a.gate_results if r.gate == gate), None) for a in state.attempts
            ]
            if any(loads):
                # The host's load while the rounds ran: a speed measured on a busy host says so.
                table.add_row("  host load", *(shown(line or "-") for line in loads))
        table.add_row("detail", *(shown(a.detail[:120]) for a in state.attempts))
        console.print(table)
    if state.pending_decision:
        request = state.pending_decision
        console.print(
            f"[yellow]waiting for a decision[/yellow] {shown(request.id)}: {shown(request.question)}"
        )
        for line in request.evidence:
            console.print(f"    {shown(line)}", highlight=False, soft_wrap=True)
        allowed = request.allowed
        excluded = f"; may not: {shown(request.excluded)}" if request.excluded else ""
        console.print(f"  options: {shown(request.options)}; may decide: {shown(allowed)}{excluded}")
        who = allowed[0] if allowed else "<decider>"
        console.print(
            shown(
                f"  answer:  daedalus decide {request.id} {request.options[0]} --as {who} [--note ... --lesson]"
            )
        )


@app.command()
def amend(
    ticket_id: str,
    who: Annotated[str | None, typer.Option("--as", help=AS_HELP)] = None,
    spec_text: Annotated[str | None, typer.Option("--spec", help="new brief text")] = None,
    constraint: Annotated[list[str] | None, typer.Option(help="replace the constraints (repeatable)")] = None,
    max_attempts: Annotated[int | None, typer.Option(min=1, max=10)] = None,
    note: str = "",
) -> None:
    """Change a live ticket's brief, constraints or attempt budget (applies from the next attempt)."""
    stack = stack_client()
    who = stack.acting_as(who)
    amendment = validated(
        SpecAmendment,
        amended_by=who,
        spec=spec_text,
        constraints=constraint,
        max_attempts=max_attempts,
        note=note,
    )
    print_state(stack.amend(ticket_id, amendment))


@app.command()
def cancel(
    ticket_id: str,
    reason: Annotated[str, typer.Option(help="why")],
    who: Annotated[str | None, typer.Option("--as", help=AS_HELP)] = None,
) -> None:
    """Cancel a live ticket; its running step and that step's processes on the host are stopped."""
    stack = stack_client()
    who = stack.acting_as(who)
    state = stack.cancel(ticket_id, validated(CancelRequest, requested_by=who, reason=reason))
    console.print(shown(f"ticket {ticket_id}: cancel requested by {who} (status now {state.status.value})"))


@app.command()
def terminate(
    ticket_id: str,
    reason: Annotated[str, typer.Option(help="why, kept in the closing audit event")],
    who: Annotated[
        str | None, typer.Option("--as", help=f"{AS_HELP}; a decider, or an operator of the ticket's host")
    ] = None,
) -> None:
    """Last resort for a wedged ticket that cannot be cancelled: terminate its workflow and close its trail."""
    stack = stack_client()
    who = stack.acting_as(who)
    events = stack.terminate(ticket_id, validated(TerminateRequest, requested_by=who, reason=reason))
    closed = [f"{event.ticket_id} (#{event.seq})" for event in events]
    console.print(shown(f"ticket {ticket_id} terminated by {who}; closing audit events: {', '.join(closed)}"))


def draft(
    request: Annotated[str, typer.Argument(help="the request in your words")],
    ticket_id: Annotated[str | None, typer.Option("--id", help="the ticket id to use")] = None,
    host: Annotated[str | None, typer.Option(help="the host to use")] = None,
    out: Annotated[Path | None, typer.Option("-o", "--out", help="write the draft YAML here")] = None,
) -> None:
    """The lead agent drafts a ticket spec from a short request; review it, then `ticket create -f`."""
    import yaml

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


app.command()(draft)
