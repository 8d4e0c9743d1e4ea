"""`daedalus question ...` and `daedalus rulings`: ask the deciders a question that belongs to no ticket, list
and read questions, withdraw one, and list the standing rulings. Answer a question with `daedalus decide`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from daedalus.cli._common import console, fail
from daedalus.cli.clients import stack_client
from daedalus.escaping import for_terminal

app = typer.Typer(
    add_completion=False,
    help="Questions for the deciders that belong to no ticket; answer them with `daedalus decide`.",
)
AS_HELP = "who acts (the local stack trusts it; a shared stack takes it from your token)"


@app.command()
def ask(
    file: Annotated[Path, typer.Option("-f", "--file", help="question (YAML), see examples/questions/")],
    who: Annotated[str | None, typer.Option("--as", help=AS_HELP)] = None,
) -> None:
    """Ask the deciders; refused (nothing started) for a past deadline, unknown deciders or an id asked before."""
    from daedalus.services import questions

    spec = questions.load_question(file)
    stack = stack_client()
    who = stack.acting_as(who)
    deciders = stack.ask_question(spec, who).deciders
    console.print(
        for_terminal(
            f"asked question {spec.id} of {', '.join(deciders)} (deadline {spec.deadline:%Y-%m-%d %H:%M} UTC); "
            f"answer it with `daedalus decide {spec.id}-question-1 <{'|'.join(spec.options)}>`"
        ),
        highlight=False,
    )


@app.command("list")
def list_(
    pending: Annotated[bool, typer.Option("--pending", help="only questions still waiting")] = False,
) -> None:
    """Questions from the store, oldest first: open ones with their request id, answered ones with the answer."""
    rows = stack_client().list_questions(pending)
    if not rows:
        console.print("no questions" + (" waiting" if pending else ""))
    for row in rows:
        if row.open:
            state = f"open: {'|'.join(row.options)}"
        elif row.decided_by:
            state = f"done: {row.decided_by} chose {row.option}"
        else:
            state = row.note or "closed"
        console.print(for_terminal(f"{row.request_id}  {row.question}  [{state}]"), highlight=False)


@app.command()
def show(question_id: str) -> None:
    """One question's state: its pending request (id, options, evidence), or its outcome and any ruling."""
    state = stack_client().question(question_id)
    lines = [f"question {state.question_id}: {state.question}", f"status: {state.status.value}"]
    lines.append(f"asked by {state.asked_by}; deadline {state.deadline:%Y-%m-%d %H:%M} UTC")
    request = state.pending_decision
    if request is not None:
        lines.append(
            f"waiting: {request.id} for {', '.join(request.allowed)}; options: {', '.join(request.options)}"
        )
        lines += [f"  evidence: {line}" for line in request.evidence]
    if state.outcome is not None:
        by = f" by {state.decided_by}" if state.decided_by else " (at the deadline)"
        lines.append(f"outcome: {state.outcome}{by}" + (f": {state.note}" if state.note else ""))
    if state.ruling is not None:
        from daedalus.decisions.rulings import describe

        lines.append(f"ruling: {state.ruling.label()}: {describe(state.ruling)}")
    lines.append(f"its audit trail: daedalus audit --ticket question:{state.question_id}")
    console.print(for_terminal("\n".join(lines)), highlight=False)


@app.command()
def withdraw(
    question_id: str,
    reason: Annotated[str, typer.Option(help="why, kept in the audit trail")],
    who: Annotated[str | None, typer.Option("--as", help=AS_HELP)] = None,
) -> None:
    """Withdraw an open question (its asker or a decider)."""
    from daedalus.decisions.questions import WithdrawQuestion

    stack = stack_client()
    who = stack.acting_as(who)
    try:
        request = WithdrawQuestion(requested_by=who, reason=reason)
    except ValueError as error:
        fail(f"cannot withdraw question {question_id}: {error}")
    stack.withdraw_question(question_id, request)
    console.print(for_terminal(f"question {question_id} withdrawn by {who}"), highlight=False)


def rulings() -> None:
    """The standing rulings, oldest first: what each forbids or requires, who ruled and when."""
    from daedalus.decisions.rulings import describe

    found = stack_client().rulings()
    if not found:
        console.print("no standing rulings")
    for ruling in found:
        console.print(for_terminal(f"{ruling.label()}: {describe(ruling)}"), highlight=False)
