"""`daedalus train ...`: start, watch, stop and list the deaths of training runs.

Errors are a message on stderr and exit code 2, as in every other `daedalus` command (cli/_common.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
import yaml
from pydantic import ValidationError
from rich.table import Table
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from daedalus.cli._common import client, console, fail, run, settings
from daedalus.escaping import for_terminal as shown
from daedalus.schemas.ticket import Decision
from daedalus.schemas.training import (
    StopTraining,
    TrainingRunInput,
    TrainingRunSpec,
    TrainingRunStatus,
    training_workflow_id,
)
from daedalus.workflows.training import TrainingRunWorkflow

T = TypeVar("T")
Handle = WorkflowHandle[TrainingRunWorkflow, TrainingRunStatus]

app = typer.Typer(help="Training runs supervised by the watchdog.", no_args_is_help=True)


def load_spec(path: Path) -> TrainingRunSpec:
    """Read and validate a run file; exits 2 with what is wrong, field by field, before anything starts."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        fail(f"{path}: cannot read the run file: {exc.strerror or exc}")
    except yaml.YAMLError as exc:
        fail(f"{path}: not valid YAML: {exc}")
    if not isinstance(data, dict):
        fail(
            f"{path}: a run file is a mapping of fields (name, host, command, ...), got {type(data).__name__}"
        )
    try:
        spec = TrainingRunSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'run'}: {e['msg']}" for e in exc.errors())
        fail(f"{path}: invalid training run: {problems}")
    if spec.restart.escalate_after_deaths and spec.hunt.engine is None:
        # Checked at filing, not in the schema, so that runs filed before the rule still load from history.
        fail(
            f"{path}: hunt.engine is missing: the hunting ticket opened after "
            f"{spec.restart.escalate_after_deaths} deaths needs the repository its agent works in, e.g. "
            "hunt: {agent: codex, engine: {name: trainer, kind: repo, repo: <path or URL>, base_commit: main}}"
        )
    return spec


def _on_run(name: str, call: Callable[[Handle], Awaitable[T]]) -> T:
    """Call `call` on run `name`'s workflow; an unknown run or a refused update is a clear error."""

    async def go() -> T:
        handle = (await client()).get_workflow_handle_for(TrainingRunWorkflow.run, training_workflow_id(name))
        try:
            return await call(handle)
        except WorkflowUpdateFailedError as exc:
            fail(f"training run {name}: {exc.cause or exc}")
        except RPCError as exc:
            if exc.status is not RPCStatusCode.NOT_FOUND:
                fail(f"training run {name}: {exc.message}")
        # Not found: either there never was such a run, or it has ended (an update cannot reach it then).
        try:
            ended = await handle.describe()
        except RPCError:
            fail(f"no training run named {name} (workflow {training_workflow_id(name)} not found)")
        state = ended.status.name.lower() if ended.status else "closed"
        fail(f"training run {name} has already ended (workflow {state}); `daedalus train history {name}`")

    return run(go())


@app.command()
def start(file: Annotated[Path, typer.Option("-f", "--file", help="run.yaml")]) -> None:
    """Start a training run (workflow id training-<name>); refuses a second live run of the same name."""
    spec = load_spec(file)

    async def go() -> str:
        handle = await (await client()).start_workflow(
            TrainingRunWorkflow.run,
            TrainingRunInput(spec=spec),
            id=spec.workflow_id,
            task_queue=settings().temporal.control_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
        return handle.id

    try:
        workflow_id = run(go())
    except WorkflowAlreadyStartedError:
        fail(f"training run {spec.name} is already running; `daedalus train stop {spec.name}` first")
    console.print(shown(f"started {workflow_id} on host {spec.host}"))


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
        ("last checkpoint", status.last_checkpoint or "-"),
        ("deaths (counter)", f"{len(status.deaths)} ({status.death_counter})"),
        ("hunting tickets", ", ".join(status.hunting_tickets) or "-"),
        ("awaiting", status.pending_decision.question if status.pending_decision else "-"),
        ("host", status.host_report.summary() if status.host_report else "-"),
    ]
    for key, value in rows:
        table.add_row(key, shown(value))
    return table


@app.command()
def status(name: str) -> None:
    """State, memory now, slope, last checkpoint and deaths of a run."""
    console.print(render_status(_on_run(name, lambda h: h.query(TrainingRunWorkflow.status))))


@app.command()
def stop(
    name: str,
    by: Annotated[str, typer.Option("--by", help="who stops it (recorded in the audit trail)")] = "cli",
    reason: Annotated[str, typer.Option(help="why (recorded)")] = "stopped by request",
) -> None:
    """Stop a run gracefully: checkpoint signal, then SIGTERM, then SIGKILL of its process group."""
    result = _on_run(
        name,
        lambda h: h.execute_update(TrainingRunWorkflow.stop, StopTraining(requested_by=by, reason=reason)),
    )
    console.print(shown(f"stopping {name} (incarnation {result.incarnation})"))


@app.command()
def decide(
    name: str,
    option: Annotated[str, typer.Argument(help="restart | stop")],
    who: Annotated[str, typer.Option("--as", help="who decides (must be a decider of the run)")],
    note: Annotated[str, typer.Option(help="reason, kept in the audit trail")] = "",
) -> None:
    """Answer a run's pending escalation (after its third death): restart from the checkpoint, or stop."""

    async def answer(handle: Handle) -> TrainingRunStatus:
        request = (await handle.query(TrainingRunWorkflow.status)).pending_decision
        if request is None:
            fail(f"training run {name} is not waiting for a decision")
        try:
            decision = Decision(
                request_id=request.id, option=option, decided_by=who, note=note, channel="cli"
            )
        except ValidationError as exc:
            fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
        return await handle.execute_update(TrainingRunWorkflow.decide, decision)

    result = _on_run(name, answer)
    console.print(shown(f"{who} chose {option!r} for training run {name}; it is {result.state.value}"))


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
    console.print(render_history(_on_run(name, lambda h: h.query(TrainingRunWorkflow.status))))
