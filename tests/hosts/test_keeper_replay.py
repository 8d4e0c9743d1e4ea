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
from daedalus.hosts.leases import LeaseRequest, LeaseStatus, keeper_id
from daedalus.payloads import DATA_CONVERTER
from daedalus.workflows.lease_keeper import CARRY_REFUSALS, LeaseKeeperWorkflow
from tests.hosts.keeper_support import running_keeper
from tests.hosts.test_constraints import CAP, launch
from tests.hosts.test_tenants import render_queue, tenant_started, wait_running
from tests.replay_split import replay_split_too

HISTORIES = Path(__file__).parent / "histories"
STORED = sorted(HISTORIES.glob("lease-keeper-*.json"))
REFUSALS = sorted(HISTORIES.glob("lease-keeper-refusals-*.json"))


def replayer() -> Replayer:
    return Replayer(workflows=[LeaseKeeperWorkflow], data_converter=DATA_CONVERTER)


@pytest.mark.parametrize("stored", STORED, ids=[path.stem for path in STORED])
async def test_stored_history_replays(stored: Path) -> None:
    history = WorkflowHistory.from_json(stored.stem, stored.read_text())
    await replay_split_too(replayer(), history)


def test_the_histories_of_every_recording_commit_are_kept() -> None:
    commits = {path.stem.removeprefix("lease-keeper-") for path in STORED}
    assert {"68922a1", "551e656", "381dc57", "6ad1f4b"} <= commits, commits


def head() -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
    )
    return found.stdout.strip()


def test_a_stored_history_carries_refusals_across_continue_as_new() -> None:
    """What the refusals' history guards: the new code's marker, and the continue-as-new that carried them."""
    assert REFUSALS, "tests/hosts/histories/lease-keeper-refusals-<commit>.json is missing"
    for stored in REFUSALS:
        events = WorkflowHistory.from_json(stored.stem, stored.read_text()).events
        markers = [
            e.marker_recorded_event_attributes
            for e in events
            if e.HasField("marker_recorded_event_attributes")
        ]
        assert any(CARRY_REFUSALS.encode() in m.details["patch-data"].payloads[0].data for m in markers), (
            stored
        )
        assert events[-1].HasField("workflow_execution_continued_as_new_event_attributes"), stored
        carried = events[-1].workflow_execution_continued_as_new_event_attributes.input.payloads[0].data
        assert b"not granted within 1s" in carried, stored


def test_the_histories_from_before_the_refusals_patch_never_ask_for_it() -> None:
    """Replaying them (above) takes the old path: they hold no marker of it."""
    for stored in set(STORED) - set(REFUSALS):
        assert CARRY_REFUSALS not in stored.read_text(), stored


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
        (HISTORIES / f"lease-keeper-{head()}.json").write_text(history.to_json())


async def test_record_refusals_carried_across_continue_as_new(
    temporal_client: Client, tmp_path: Path
) -> None:
    """A lease refused before the keeper continues as new is still REFUSED, with its reason, after it: the holder
    that asks late hears why, not 'never asked for'. Writes lease-keeper-refusals-<HEAD>.json when recording."""
    async with running_keeper(temporal_client, tmp_path, gpus=2, max_history=60) as keeper:
        host = keeper.host
        handle = temporal_client.get_workflow_handle(keeper_id(host))
        first_run = (await handle.describe()).run_id
        await holder.acquire(temporal_client, host, LeaseRequest(lease_id="hog", holder="hog", gpus=[0]))
        late = LeaseRequest(lease_id="late", holder="late", gpus=[0], wait_timeout_s=1)
        with pytest.raises(holder.LeaseRefused, match="not granted within 1s; held by hog"):
            await holder.acquire(temporal_client, host, late)
        for i in range(40):  # until the keeper's history passes 60 events and it continues as new
            if (await handle.describe()).run_id != first_run:
                break
            await holder.acquire(temporal_client, host, LeaseRequest(lease_id=f"c{i}", holder="c", gpus=[1]))
            await holder.release(temporal_client, host, f"c{i}")
        else:
            raise AssertionError("the keeper never continued as new")
        outcome = await holder._query_lease(temporal_client, host, "late")
        assert outcome.status is LeaseStatus.REFUSED, outcome
        assert "not granted within 1s; held by hog on GPUs [0]" in outcome.reason
        assert [r.lease_id for r in (await holder.keeper_state(temporal_client, host)).refusals] == ["late"]
        # Asking again after a refusal is a new request, also in the new run.
        await holder.release(temporal_client, host, "hog")
        assert (await holder.acquire(temporal_client, host, late)).status is LeaseStatus.GRANTED
        history = await temporal_client.get_workflow_handle(keeper_id(host), run_id=first_run).fetch_history()
    await replay_split_too(replayer(), history)
    if os.environ.get("DAEDALUS_RECORD_HISTORIES"):
        (HISTORIES / f"lease-keeper-refusals-{head()}.json").write_text(history.to_json())
