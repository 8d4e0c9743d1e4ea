"""/training: the API starts, reads and stops a real training run, through the same services as the CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.schemas.training import RunState, TrainingRunStatus
from daedalus.workflows.training import TrainingRunWorkflow
from tests.api.conftest import as_
from tests.workflows.test_training import make_spec, trainers, workers


async def until_running(api: httpx.AsyncClient, name: str) -> TrainingRunStatus:
    for _ in range(300):
        answer = await api.get(f"/training/{name}", headers=as_("wayne"))
        if answer.status_code == 200:
            status = TrainingRunStatus.model_validate(answer.json())
            if status.trainer_pid is not None:
                return status
        await asyncio.sleep(0.2)
    raise AssertionError(f"run {name} never ran: {answer.text}")


async def test_start_read_and_stop_a_run(
    api: httpx.AsyncClient, temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.05")
    body = spec.model_dump(mode="json")
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine):
        started = await api.post("/training", json=body, headers=as_("wayne"))
        assert started.status_code == 201, started.text
        assert started.json()["workflow_id"] == f"training-{spec.name}"
        assert started.json()["started_by"] == "wayne"
        running = await until_running(api, spec.name)
        assert running.state is RunState.RUNNING and [p.pid for p in trainers(spec)] == [running.trainer_pid]

        again = await api.post("/training", json=body, headers=as_("wayne"))
        assert again.status_code == 409 and "already running" in again.json()["detail"]
        stop = {"requested_by": "wayne", "reason": "enough"}
        as_someone_else = await api.post(f"/training/{spec.name}/stop", json=stop, headers=as_("mallory"))
        assert as_someone_else.status_code == 403
        stopped = await api.post(f"/training/{spec.name}/stop", json=stop, headers=as_("wayne"))
        assert stopped.status_code == 200, stopped.text
        handle = temporal_client.get_workflow_handle_for(TrainingRunWorkflow.run, spec.workflow_id)
        final = await asyncio.wait_for(handle.result(), 60)
    assert final.state is RunState.STOPPED and not trainers(spec)
    ended = await api.post(f"/training/{spec.name}/stop", json=stop, headers=as_("wayne"))
    assert ended.status_code == 404 and "has already ended" in ended.json()["detail"]


async def test_refusals_say_what_is_wrong(api: httpx.AsyncClient, tmp_path: Path) -> None:
    missing = await api.get("/training/no-such-run", headers=as_("wayne"))
    assert missing.status_code == 404 and "no training run named no-such-run" in missing.json()["detail"]
    body = make_spec(tmp_path).model_dump(mode="json")
    body["hunt"]["engine"] = None
    no_hunt = await api.post("/training", json=body, headers=as_("wayne"))
    assert no_hunt.status_code == 422 and "hunt.engine is missing" in no_hunt.json()["detail"]
    body["host"] = "bad host!"
    bad = await api.post("/training", json=body, headers=as_("wayne"))
    assert bad.status_code == 422 and "host" in str(bad.json()["detail"])
