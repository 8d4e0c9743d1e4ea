"""/training: start a training run, read its status, stop it. The same services as `daedalus train`."""

from __future__ import annotations

from fastapi import APIRouter, status

from daedalus import services
from daedalus.api.context import Caller, Context, TemporalClient, require_same_person
from daedalus.api.errors import refusal, within
from daedalus.api.models import RunStarted
from daedalus.schemas.training import StopTraining, TrainingRunSpec, TrainingRunStatus

router = APIRouter(prefix="/training", tags=["training"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=RunStarted)
async def start_run(
    spec: TrainingRunSpec, caller: Caller, context: Context, client: TemporalClient
) -> RunStarted:
    """Start a training run (the body is a run file, as JSON). 409 while a run of that name is live."""
    try:
        registry = context.registry() if context.hosts_file is not None else None
        handle = await services.start_run(
            client,
            spec,
            queue=context.control_queue,
            hosts=registry,
            started_by=caller,
            policy=context.policy,
        )
    except services.RequestRefused as error:
        raise refusal(error) from error
    return RunStarted(
        name=spec.name,
        workflow_id=handle.id,
        run_id=handle.first_execution_run_id,
        host=spec.host,
        started_by=caller,
    )


@router.get("/{name}", response_model=TrainingRunStatus)
async def run_status(name: str, _: Caller, context: Context, client: TemporalClient) -> TrainingRunStatus:
    """State, memory now, slope, last checkpoint, deaths and the pending escalation of a run."""
    try:
        return await within(services.run_status(client, name), context.settings.update_timeout_s, name)
    except services.RequestRefused as error:
        raise refusal(error) from error


@router.post("/{name}/stop", response_model=TrainingRunStatus)
async def stop_run(
    name: str, request: StopTraining, caller: Caller, context: Context, client: TemporalClient
) -> TrainingRunStatus:
    """Stop a run gracefully (checkpoint signal, SIGTERM, SIGKILL); `requested_by` must be the caller, and
    under the policy its starter, a decider or an operator of its host."""
    require_same_person(caller, request.requested_by, "requested_by")
    stopping = services.stop_run(client, name, request, policy=context.policy)
    try:
        return await within(stopping, context.settings.update_timeout_s, name)
    except services.RequestRefused as error:
        raise refusal(error) from error
