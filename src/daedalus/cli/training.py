"""`daedalus train ...`: start, watch, stop and list the deaths of training runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import WorkflowAlreadyStartedError

from daedalus.config import Settings
from daedalus.schemas.training import StopTraining, TrainingRunInput, TrainingRunSpec, TrainingRunStatus
from daedalus.workflows.training import TrainingRunWorkflow

app = typer.Typer(help="Training runs supervised by the watchdog.", no_args_is_help=True)
console = Console()


async def _client() -> Client:
    return await Client.connect(Settings().address, data_converter=pydantic_data_converter)


async def _handle(name: str) -> WorkflowHandle[TrainingRunWorkflow, TrainingRunStatus]:
    client = await _client()
    return client.get_workflow_handle_for(TrainingRunWorkflow.run, f"training-{name}")


def load_spec(path: Path) -> TrainingRunSpec:
    """Read and validate a run file; exits with the validation message on bad input."""
    try:
        data = yaml.safe_load(path.read_text())
        return TrainingRunSpec.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        console.print(f"[red]{path}: {exc}[/red]")
        raise typer.Exit(2) from exc


@app.command()
def start(file: Path = typer.Option(..., "-f", "--file", help="run.yaml")) -> None:
    """Start a training run (workflow id training-<name>); refuses a second live run of the same name."""
    spec = load_spec(file)

    async def go() -> str:
        client = await _client()
        handle = await client.start_workflow(
            TrainingRunWorkflow.run,
            TrainingRunInput(spec=spec),
            id=spec.workflow_id,
            task_queue=Settings().control_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
        return handle.id

    try:
        workflow_id = asyncio.run(go())
    except WorkflowAlreadyStartedError as exc:
        console.print(f"[red]training run {spec.name} is already running; `daedalus train stop {spec.name}` first[/red]")
        raise typer.Exit(1) from exc
    console.print(f"started {workflow_id} on host {spec.host}")


def render_status(status: TrainingRunStatus) -> Table:
    table = Table(title=f"training run {status.name} on {status.host}", show_header=False)
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
        ("last checkpoint", status.last_checkpoint or "-"),
        ("deaths (counter)", f"{len(status.deaths)} ({status.death_counter})"),
        ("hunting tickets", ", ".join(status.hunting_tickets) or "-"),
        ("awaiting", status.pending_decision.question if status.pending_decision else "-"),
        ("host", status.host_report.summary() if status.host_report else "-"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table


@app.command()
def status(name: str) -> None:
    """State, memory now, slope, last checkpoint and deaths of a run."""

    async def go() -> TrainingRunStatus:
        return await (await _handle(name)).query(TrainingRunWorkflow.status)

    console.print(render_status(asyncio.run(go())))


@app.command()
def stop(name: str, by: str = typer.Option("cli", "--by"), reason: str = "stopped by request") -> None:
    """Stop a run gracefully: checkpoint signal, then SIGTERM, then SIGKILL of its process group."""

    async def go() -> TrainingRunStatus:
        handle = await _handle(name)
        return await handle.execute_update(TrainingRunWorkflow.stop, StopTraining(requested_by=by, reason=reason))

    result = asyncio.run(go())
    console.print(f"stopping {name} (incarnation {result.incarnation})")


def render_history(status: TrainingRunStatus) -> Table:
    """The seed's table: run, outcome, cause / fix (the fix is the decider's note that followed, if any)."""
    table = Table(title=f"training run {status.name}: deaths")
    for column in ("run", "outcome", "lived", "cause / fix", "evidence"):
        table.add_column(column)
    for death in status.deaths:
        table.add_row(
            death.id,
            death.death_class.value,
            f"{death.lifetime_s / 60:.1f} min",
            death.summary,
            f"{death.curve_path or '-'}\n{death.log_tail_path or '-'}",
        )
    if status.state.value in ("running", "starting", "restarting"):
        table.add_row(f"{status.name}#{status.incarnation}", status.state.value, "-", "-", "-")
    return table


@app.command()
def history(name: str) -> None:
    """Every incarnation of a run: outcome and cause."""

    async def go() -> TrainingRunStatus:
        return await (await _handle(name)).query(TrainingRunWorkflow.status)

    console.print(render_history(asyncio.run(go())))
