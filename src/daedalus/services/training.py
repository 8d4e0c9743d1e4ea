"""Training runs: read and check a run file, start a run, stop it, read its status.

The CLI (`daedalus train ...`) and the HTTP API (`/training`) both call these; a refusal is a `TrainingRefused`
whose message says what is wrong and what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError
from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from daedalus.decisions.policy import Policy, resolve_training
from daedalus.errors import NotAllowed
from daedalus.hosts.registry import Registry, unknown_host_message
from daedalus.ids import training_workflow_id
from daedalus.schemas import search_attributes
from daedalus.schemas.training import StopTraining, TrainingRunInput, TrainingRunSpec, TrainingRunStatus
from daedalus.schemas.ui import training_summary
from daedalus.services._temporal import TrainingRefused, update
from daedalus.workflows.training import TrainingRunWorkflow


def parse_run_spec(data: Any, source: str = "run") -> TrainingRunSpec:
    """Validate a run; every problem is reported with its field path, before anything starts."""
    if not isinstance(data, dict):
        raise TrainingRefused(
            f"{source}: a run file is a mapping of fields (name, host, command, ...), got {type(data).__name__}"
        )
    try:
        spec = TrainingRunSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'run'}: {e['msg']}" for e in exc.errors())
        raise TrainingRefused(f"{source}: invalid training run: {problems}") from exc
    require_startable(spec, source)
    return spec


def require_startable(spec: TrainingRunSpec, source: str = "run") -> None:
    """Checked when a run starts, not in the schema, so that runs filed before the rule still load."""
    if spec.restart.escalate_after_deaths and spec.hunt.engine is None:
        raise TrainingRefused(
            f"{source}: hunt.engine is missing: the hunting ticket opened after "
            f"{spec.restart.escalate_after_deaths} deaths needs the repository its agent works in, e.g. "
            "hunt: {agent: codex, engine: {name: trainer, kind: repo, repo: <path or URL>, base_commit: main}}"
        )


def load_run_spec(path: Path, base: Path | None = None) -> TrainingRunSpec:
    """Read a run file (YAML or JSON). With `base` (the directory its starter runs the command in), the run's
    relative paths are made absolute against it here, so no worker reads them against its own directory."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise TrainingRefused(f"{path}: cannot read the run file: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise TrainingRefused(f"{path}: not valid YAML: {exc}") from exc
    spec = parse_run_spec(data, str(path))
    return spec.resolved_against(base) if base is not None else spec


async def start_run(
    client: Client,
    spec: TrainingRunSpec,
    *,
    queue: str,
    hosts: Registry | None = None,
    started_by: str = "cli",
    policy: Policy | None = None,
) -> WorkflowHandle[TrainingRunWorkflow, TrainingRunStatus]:
    """Start `training-<name>`; refuses while a run of that name is live, allows a new one after it ended.

    With `hosts` (the registry), a run on an undeclared host is refused, and a run on a host with GPUs holds a
    lease on all of them for as long as it lives. With the server's `policy`, a run started by someone who does
    not operate its host waits for a dispatch decision by someone else before the trainer starts; a spec that
    loosens its approval is refused."""
    require_startable(spec)
    gpus = 0
    if hosts is not None:
        if spec.host not in hosts.names:
            raise TrainingRefused(f"training run {spec.name}: {unknown_host_message(spec.host, hosts.names)}")
        gpus = hosts.host(spec.host).gpus.count
    dispatch = None
    if policy is not None:
        spec, dispatch = resolve_training(policy, spec, started_by)
    try:
        return await client.start_workflow(
            TrainingRunWorkflow.run,
            TrainingRunInput(spec=spec, gpus=gpus, dispatch=dispatch, started_by=started_by.lower()),
            id=spec.workflow_id,
            task_queue=queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            search_attributes=search_attributes.on_host(spec.host),
            static_summary=training_summary(spec),
        )
    except WorkflowAlreadyStartedError as error:
        raise TrainingRefused(
            f"training run {spec.name} is already running; `daedalus train stop {spec.name}` first"
        ) from error


async def stop_run(
    client: Client, name: str, request: StopTraining, *, policy: Policy | None = None
) -> TrainingRunStatus:
    """Stop a run gracefully: checkpoint signal, then SIGTERM, then SIGKILL of its process group. With the
    server's `policy`, only a decider, an operator of the run's host or the run's starter may stop it."""
    if policy is not None:
        run = await run_status(client, name)
        if not policy.may_stop(request.requested_by, run.host, run.started_by):
            raise NotAllowed(
                f"{request.requested_by} may not stop training run {name}: only its starter "
                f"({run.started_by}), a decider, or an operator of {run.host} may; ask one of them"
            )
    try:
        result: TrainingRunStatus = await update(
            client,
            training_workflow_id(name),
            f"training run {name}",
            TrainingRunWorkflow.stop,
            request,
            refused=TrainingRefused,
        )
    except TrainingRefused as error:
        if isinstance(error.__cause__, RPCError) and error.__cause__.status is RPCStatusCode.NOT_FOUND:
            await _explain_missing(client, name, error.__cause__)
        raise
    return result


async def run_status(client: Client, name: str) -> TrainingRunStatus:
    """A live run's status from its query; an ended one's from its result."""
    handle = client.get_workflow_handle_for(TrainingRunWorkflow.run, training_workflow_id(name))
    try:
        status: TrainingRunStatus = await handle.query(TrainingRunWorkflow.status)
        return status
    except RPCError as error:
        if error.status is not RPCStatusCode.NOT_FOUND:
            raise TrainingRefused(f"training run {name}: {error.message}") from error
        await _explain_missing(client, name, error)
    except WorkflowQueryFailedError as error:
        raise TrainingRefused(f"training run {name} could not report its status: {error}") from error


async def _explain_missing(client: Client, name: str, not_found: RPCError) -> NoReturn:
    """Not found: either there never was such a run, or it has ended (an update cannot reach it then)."""
    workflow_id = training_workflow_id(name)
    try:
        ended = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as missing:
        raise TrainingRefused(f"no training run named {name} (workflow {workflow_id} not found)") from missing
    state = ended.status.name.lower() if ended.status else "closed"
    raise TrainingRefused(
        f"training run {name} has already ended (workflow {state}); `daedalus train history {name}`"
    ) from not_found
