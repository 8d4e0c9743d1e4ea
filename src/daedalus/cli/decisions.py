"""`daedalus decide` and `daedalus delegate`: answer a pending decision, or let someone else answer."""

from __future__ import annotations

from typing import Annotated

import typer

from daedalus.cli._common import console, fail, validated
from daedalus.cli.clients import AS_HELP, stack_client
from daedalus.escaping import for_terminal as shown
from daedalus.schemas.ticket import Decision, DecisionKind, Delegation


def decide(
    request_id: Annotated[str, typer.Argument(help="e.g. 4-dispatch-1 (see `daedalus ticket show`)")],
    option: Annotated[str, typer.Argument(help="one of the request's options")],
    who: Annotated[str | None, typer.Option("--as", help=AS_HELP)] = None,
    note: Annotated[str, typer.Option(help="reason, kept in the audit trail")] = "",
    lesson: Annotated[
        bool,
        typer.Option(
            "--lesson",
            help="the note is a lesson: later agents on this engine or host get it in their prompt",
        ),
    ] = False,
) -> None:
    """Answer a pending decision. Refused (and nothing written) for an unknown request, option or decider."""
    stack = stack_client()
    who = stack.acting_as(who)
    if lesson and not note.strip():
        fail(
            '--lesson marks the note as a lesson, and there is no note: add --note "what later agents should know"'
        )
    decision = validated(
        Decision,
        request_id=request_id,
        option=option,
        decided_by=who,
        note=note,
        channel="cli",
        lesson=lesson,
    )
    stack.decide(decision)
    kept = "; the note is recorded as a lesson" if lesson else ""
    console.print(shown(f"{who} chose {option!r} for {request_id}{kept}"))


def delegate(
    ticket_id: str,
    to: Annotated[str, typer.Option(help="who may decide on your behalf")],
    who: Annotated[str | None, typer.Option("--as", help=AS_HELP)] = None,
    kind: Annotated[
        DecisionKind,
        typer.Option(
            help="which decisions: escalation (retry, accept, fail...); dispatch only without a policy, where "
            "the policy's standing delegations decide who approves a dispatch"
        ),
    ] = DecisionKind.ESCALATION,
) -> None:
    """Let someone decide one kind of decision for a ticket ("the lead may answer its escalations for me").
    Refused before anything is written when the server's policy would not honour it."""
    stack = stack_client()
    who = stack.acting_as(who)
    people = stack.delegate(ticket_id, validated(Delegation, granted_by=who, delegate=to, kind=kind))
    console.print(
        shown(f"ticket {ticket_id}: {kind.value} decisions may now also be made by {', '.join(people)}")
    )
