"""`daedalus train ...`: start, watch, stop and list the deaths of training runs.

With DAEDALUS_API_URL set, every command goes through the shared stack's API as the token's person
(cli/clients.py). Errors are a message on stderr and exit code 2, as in every other `daedalus` command.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from daedalus import services
from daedalus.cli._common import console, fail
from daedalus.cli.clients import stack_client
from daedalus.decisions.schemas import Decision
from daedalus.escaping import for_terminal as shown
from daedalus.schemas.training import StopTraining, TrainingRunSpec, TrainingRunStatus

app = typer.Typer(help="Training runs supervised by the watchdog.", no_args_is_help=True)


@app.command()
def start(
    file: Annotated[Path, typer.Option("-f", "--file", help="run.yaml")],
    started_by: Annotated[
        str | None, typer.Option("--as", help="who starts it (local, without a policy: `cli`)")
    ] = None,
) -> None:
    """Start a training run (workflow id training-<name>); refuses a second live run of the same name. Under a
    policy, a run on a host you do not operate waits for someone else's dispatch decision."""
    stack = stack_client()
    starter = stack.filer(started_by)
    started = stack.start_run(_read_spec(file), starter)
    # A shared stack says whom it took the token for.
    by = f" as {started.started_by}" if stack.shared else ""
    console.print(shown(f"started {started.workflow_id} on host {started.host}{by}"))


def _read_spec(file: Path) -> TrainingRunSpec:
    try:
        return services.load_run_spec(file, base=Path.cwd())
    except services.RequestRefused as error:
        fail(str(error))


def render_status(status: TrainingRunStatus) -> Table:
    table = Table(title=shown(f"training run {status.name} on {status.host}"), show_header=False)
    mem = status.memory_now
    rows = [
        ("state", status.state.value),
        ("incarnation", str(status.incarnation)),
        ("trainer pid", str(status.trainer_pid or "-")),
        ("memory available now", f"{mem.available_gib:.2f} GiB at {mem.at:%H:%M:%S}" if mem else "-"),
        (
            "slope",
            f"{status.slope_gib_per_h:+.3f} GiB/h{' (LEAK)' if status.leak_flagged else ''}"
            if status.slope_gib_per_h is not None
            else "-",
        ),
        ("progress", status.progress.summary() if status.progress else "- (the trainer writes none)"),
        (
            "progress as of",
            f"{status.progress.at:%H:%M:%S}"
            + (
                f", done at about {status.progress.at + timedelta(seconds=status.progress.eta_s):%Y-%m-%d %H:%M:%S}"
                if status.progress.eta_s is not None
                else ""
            )
            if status.progress
            else "-",
        ),
        ("last checkpoint", status.last_checkpoint or "-"),
        ("watchdog wakes on", status.wakeups or "-"),
        ("evaluations", _evaluations(status)),
        ("deployments", "\n".join(f"{d.outcome.value}: {d.summary}" for d in status.deployments[-3:]) or "-"),
        ("deaths (counter)", f"{len(status.deaths)} ({status.death_counter})"),
        ("hunting tickets", ", ".join(status.hunting_tickets) or "-"),
        ("awaiting", status.pending_decision.question if status.pending_decision else "-"),
        ("host", status.host_report.summary() if status.host_report else "-"),
    ]
    for key, value in rows:
        table.add_row(key, shown(value))
    return table


def _evaluations(status: TrainingRunStatus) -> str:
    """The latest evaluations, one a line, and what waits for one."""
    lines = [evaluation.summary() for evaluation in status.evaluations[-3:]]
    if len(status.evaluations) > 3:
        lines.insert(0, f"({len(status.evaluations) - 3} earlier)")
    if status.waiting_evaluation:
        lines.append(f"waiting: {', '.join(Path(path).name for path in status.waiting_evaluation)}")
    return "\n".join(lines) or "-"


@app.command()
def status(name: str) -> None:
    """State, memory now, slope, progress and ETA, last checkpoint, evaluations, deployments and deaths of a run."""
    console.print(render_status(_status(name)))


@app.command()
def stop(
    name: str,
    by: Annotated[
        str | None,
        typer.Option("--by", help="who stops it (recorded; local, without a policy: `cli`)"),
    ] = None,
    reason: Annotated[str, typer.Option(help="why (recorded)")] = "stopped by request",
) -> None:
    """Stop a run gracefully: checkpoint signal, then SIGTERM, then SIGKILL of its process group. Under a
    policy, only its starter, a decider or an operator of its host may."""
    stack = stack_client()
    result = stack.stop_run(name, StopTraining(requested_by=stack.filer(by, "--by"), reason=reason))
    console.print(shown(f"stopping {name} (incarnation {result.incarnation})"))


@app.command()
def decide(
    name: str,
    option: Annotated[
        str,
        typer.Argument(
            help="approve | reject (dispatch), restart | stop (escalation), deploy | skip (deployment)"
        ),
    ],
    who: Annotated[
        str | None, typer.Option("--as", help="who decides (must be a decider of the run)")
    ] = None,
    note: Annotated[str, typer.Option(help="reason, kept in the audit trail")] = "",
) -> None:
    """Answer a run's pending decision: its dispatch (approve | reject), its escalation after its third death
    (restart from the checkpoint | stop), or a checkpoint's deployment to its serving preset (deploy | skip)."""
    stack = stack_client()
    who = stack.acting_as(who)

    def answering(status: TrainingRunStatus) -> Decision:
        request = status.pending_decision
        if request is None:
            fail(f"training run {name} is not waiting for a decision")
        try:
            return Decision(request_id=request.id, option=option, decided_by=who, note=note, channel="cli")
        except ValidationError as exc:
            fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))

    result = stack.decide_run(name, answering(stack.run_status(name)))
    console.print(shown(f"{who} chose {option!r} for training run {name}; it is {result.state.value}"))


def _status(name: str) -> TrainingRunStatus:
    return stack_client().run_status(name)


def render_history(status: TrainingRunStatus) -> Table:
    """The seed's table: run, outcome, cause / fix (the fix is the decider's note that followed, if any)."""
    table = Table(title=shown(f"training run {status.name}: deaths"))
    for column in ("run", "outcome", "lived", "cause / fix", "evidence"):
        table.add_column(column)
    for death in status.deaths:
        table.add_row(
            shown(death.id),
            death.death_class.value,
            f"{death.lifetime_s / 60:.1f} min",
            shown(death.summary),
            shown(f"{death.curve_path or '-'}\n{death.log_tail_path or '-'}"),
        )
    if status.state.value in ("running", "starting", "restarting"):
        table.add_row(f"{status.name}#{status.incarnation}", status.state.value, "-", "-", "-")
    return table


@app.command()
def history(name: str) -> None:
    """Every incarnation of a run: outcome and cause."""
    console.print(render_history(_status(name)))
