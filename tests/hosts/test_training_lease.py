"""A training run on a host with GPUs holds a lease on all of them, on the real dev server with a real trainer:
its trainer sees only the leased GPUs, a gate waits behind it, the lease survives the run's continue-as-new (no
gap in which the gate could start under the trainer), and the gate gets the GPUs once the run is stopped. The first
and last runs' histories replay."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.hosts import holder
from daedalus.hosts.leases import LeaseRequest, LeaseStatus
from daedalus.hosts.registry import GpuSpec, HostSpec, Registry
from daedalus.schemas.training import RunState, StopTraining
from daedalus.services import training
from daedalus.workflows.training import TrainingRunWorkflow
from tests.workflows.test_training import make_spec, replay, trainers, until, within, workers


async def test_a_training_run_holds_its_hosts_gpus_across_continue_as_new_until_it_ends(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.05", history_limit=100)
    gpus = GpuSpec(count=2, model="simulated", memory_gib=8, simulated=True)
    registry = Registry(hosts=[HostSpec(name=spec.host, gpus=gpus)])
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine):
        await holder.ensure_keeper(temporal_client, registry, spec.host, control_queue=task_queue)
        handle = await training.start_run(temporal_client, spec, queue=task_queue, hosts=registry)
        running = await until(handle, lambda s: s.trainer_pid is not None)
        [trainer] = trainers(spec)
        assert trainer.pid == running.trainer_pid
        assert trainer.environ()["CUDA_VISIBLE_DEVICES"] == "0,1"
        [lease] = (await holder.keeper_state(temporal_client, spec.host)).held
        assert lease.purpose == "training" and lease.gpus == [0, 1]
        assert lease.lease_id.startswith(f"{spec.workflow_id}/")

        gate = LeaseRequest(lease_id="gate-after-training", holder="a gate", gpus=[0], ttl_s=30)
        waiting = asyncio.create_task(holder.acquire(temporal_client, spec.host, gate))
        await until(handle, lambda s: s.continued >= 1 and s.state is RunState.RUNNING, timeout_s=120)
        state = await holder.keeper_state(temporal_client, spec.host)
        assert [held.lease_id for held in state.held] == [lease.lease_id]  # the same lease, never let go
        assert state.counters.released == 0 and state.counters.expired == 0 and not waiting.done()

        await within(handle.execute_update(TrainingRunWorkflow.stop, StopTraining(requested_by="wayne")))
        final = await within(handle.result())
        granted = await within(waiting)
        state = await holder.keeper_state(temporal_client, spec.host)
        await holder.release(temporal_client, spec.host, gate.lease_id)
    assert final.state is RunState.STOPPED and not trainers(spec)
    assert granted.status is LeaseStatus.GRANTED and granted.gpus == [0]
    assert state.counters.released == 1 and state.counters.expired == 0
    # The lease patch is asked after the host report (an activity on the host), and first thing in a continued
    # run: both runs replay. The last also split after its local activities; not the first, which continued as new
    # when its history grew long, and the split's extra events would make it continue sooner than it did.
    first = temporal_client.get_workflow_handle_for(
        TrainingRunWorkflow.run, spec.workflow_id, run_id=handle.first_execution_run_id
    )
    await replay(first, record_as=None, split=False)
    await replay(
        temporal_client.get_workflow_handle_for(TrainingRunWorkflow.run, spec.workflow_id), record_as=None
    )
