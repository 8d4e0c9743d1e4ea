"""LeaseKeeperWorkflow replays every history it ever stored: a change that breaks determinism for the running
keepers (they live for ever) fails here. Histories are never re-recorded to pass: each is named by the commit
that recorded it (`lease-keeper-<commit>.json`, restored from git for the ones that were overwritten), and a
behaviour change is guarded by `workflow.patched`. A new history is added with

    DAEDALUS_RECORD_HISTORIES=1 .venv/bin/pytest tests/hosts/test_keeper_replay.py -k record

which writes `lease-keeper-<HEAD>.json` (commit it beside the others).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from daedalus.hosts import holder
from daedalus.hosts.leases import LeaseRequest
from daedalus.payloads import DATA_CONVERTER
from daedalus.workflows.lease_keeper import LeaseKeeperWorkflow
from tests.hosts.keeper_support import running_keeper
from tests.hosts.test_constraints import CAP, launch
from tests.hosts.test_tenants import render_queue, tenant_started, wait_running
from tests.replay_split import replay_split_too

HISTORIES = Path(__file__).parent / "histories"
STORED = sorted(HISTORIES.glob("lease-keeper-*.json"))


def replayer() -> Replayer:
    return Replayer(workflows=[LeaseKeeperWorkflow], data_converter=DATA_CONVERTER)


@pytest.mark.parametrize("stored", STORED, ids=[path.stem for path in STORED])
async def test_stored_history_replays(stored: Path) -> None:
    history = WorkflowHistory.from_json(stored.stem, stored.read_text())
    await replay_split_too(replayer(), history)


def test_the_histories_of_every_recording_commit_are_kept() -> None:
    commits = {path.stem.removeprefix("lease-keeper-") for path in STORED}
    assert {"68922a1", "551e656", "381dc57", "6ad1f4b"} <= commits, commits


async def test_record_a_keepers_life(temporal_client: Client, tmp_path: Path) -> None:
    """Grants, a queue, an expiry, keepalives, a tenant paused and resumed, a preemption, a lifted constraint."""
    tenant = render_queue(tmp_path)
    async with running_keeper(temporal_client, tmp_path, tenants=[tenant], constraints=[CAP]) as keeper:
        host = keeper.host
        with tenant_started(tmp_path, tenant, keeper.gpu_state):
            await holder.acquire(
                temporal_client, host, LeaseRequest(lease_id="dead", holder="d", gpus=[0], ttl_s=1)
            )
            await holder.keepalive(temporal_client, host, "dead")
            waiter = LeaseRequest(lease_id="next", holder="n", gpus=[0], ttl_s=10)
            await asyncio.wait_for(holder.acquire(temporal_client, host, waiter), 15)
            await holder.release(temporal_client, host, "next")
            held = LeaseRequest(lease_id="held", holder="h", gpus=[3], ttl_s=3)
            async with holder.holding(temporal_client, host, held, heartbeat_s=0.2) as lease:
                for _ in range(100):  # two keepalives confirmed, however loaded the machine
                    if lease.heartbeats >= 2:
                        break
                    await asyncio.sleep(0.1)
            assert lease.heartbeats >= 2 and lease.lost is None
            low = LeaseRequest(lease_id="low", holder="l", gpus=[1], priority=20, ttl_s=10)
            await holder.acquire(temporal_client, host, low)
            await holder.tenant_demand(temporal_client, host, "comfyui", busy=True)
            await holder.release(temporal_client, host, "low")
            await holder.tenant_demand(temporal_client, host, "comfyui", busy=False)
            await wait_running(temporal_client, host)
            await holder.ticket_passed(temporal_client, keeper.registry, "5")
            granted = await holder.acquire(temporal_client, host, launch("long", "vllm", max_model_len=65536))
            await holder.release(temporal_client, host, granted.lease_id)
            handle = temporal_client.get_workflow_handle(f"lease-keeper-{host}")
            history = await handle.fetch_history()
    await replay_split_too(replayer(), history)
    if os.environ.get("DAEDALUS_RECORD_HISTORIES"):
        head = subprocess.run(
            ["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
        )
        (HISTORIES / f"lease-keeper-{head.stdout.strip()}.json").write_text(history.to_json())
