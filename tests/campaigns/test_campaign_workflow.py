"""CampaignWorkflow on the real dev server and store: cells land in the store as measured, a crash is a
finding, the proposal waits for the decider, and the report shows the matrix."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from temporalio import activity
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import Replayer, Worker

from daedalus import services as tickets
from daedalus.campaigns.spec import load_campaign
from daedalus.hosts import holder
from daedalus.ids import host_queue
from daedalus.payloads import DATA_CONVERTER
from daedalus.report import build_report, render_markdown
from daedalus.schemas.audit import AuditKind
from daedalus.schemas.campaigns import (
    CampaignInput,
    CampaignStatus,
    CellInput,
    CellOutcome,
    CellResult,
    campaign_workflow_id,
)
from daedalus.schemas.ticket import CancelRequest, Decision
from daedalus.services import CampaignRefused, campaigns
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.store.tables import CampaignRow
from daedalus.workflows.campaign import CampaignWorkflow
from tests.hosts.keeper_support import running_keeper
from tests.replay_split import replay_split_too
from tests.support import running_workers
from tests.ticket_helpers import events

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "campaigns"
HISTORIES = Path(__file__).resolve().parents[1] / "histories"


@pytest.mark.parametrize("name", ["campaign-adopted.json"])
async def test_stored_campaign_history_replays(name: str) -> None:
    history = WorkflowHistory.from_json("campaign", (HISTORIES / name).read_text())
    await replay_split_too(Replayer(workflows=[CampaignWorkflow], data_converter=DATA_CONVERTER), history)


measured_cells: list[str] = []


@activity.defn(name="measure_campaign_cell")
async def scripted_cell(request: CellInput) -> CellResult:
    """Stands in for the host's measurement (the llama test below runs the real one): q8_0 at 1024 crashes."""
    cell = request.cell
    measured_cells.append(cell.key)
    if cell.kv == "q8_0" and cell.context == 1024:
        return CellResult(
            cell=cell,
            preset=cell.preset_name,
            label=request.spec.label(cell.kv),
            outcome=CellOutcome.CRASHED,
            detail="llama-server exited with 134 at start",
            measured_at=datetime.now(UTC),
        )
    tps = {"f16": 100.0, "q8_0": 99.0}[cell.kv] - cell.users
    return CellResult(
        cell=cell,
        preset=cell.preset_name,
        label=request.spec.label(cell.kv),
        outcome=CellOutcome.MEASURED,
        decode_tps=tps,
        ci_low=tps - 1,
        ci_high=tps + 1,
        samples=[tps - 1, tps, tps + 1],
        kib_per_token={"f16": 8.0, "q8_0": 4.25}[cell.kv],
        needle_found=0,
        needle_total=6,
        garbage="fragments",
        measured_at=datetime.now(UTC),
    )


async def wait_status(
    handle: WorkflowHandle[CampaignWorkflow, CampaignStatus], state: str, limit: float = 120
) -> CampaignStatus:
    deadline = time.monotonic() + limit
    while True:
        status = await handle.query(CampaignWorkflow.status)
        if status.status == state:
            return status
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.3)


async def test_campaign_sweeps_records_a_crash_and_proposes_a_preset(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"hc-{task_queue[-8:]}"
    spec = load_campaign(EXAMPLES / "local-kv-matrix.yaml").model_copy(
        update={"host": host, "id": f"c-{task_queue[-8:]}"}
    )
    measured_cells.clear()
    # only the scripted worker may take the host's cells: the real host worker is not started for this host
    async with (
        running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, "elsewhere"),
        Worker(temporal_client, task_queue=host_queue(host), activities=[scripted_cell]),
    ):
        handle = await temporal_client.start_workflow(
            CampaignWorkflow.run,
            CampaignInput(spec=spec, control_queue=task_queue, filed_by="lead"),
            id=campaign_workflow_id(spec.id),
            task_queue=task_queue,
        )
        status = await wait_status(handle, "awaiting_decision")
        assert status.cells_total == status.cells_done == 12 and status.cells_crashed == 2
        assert status.proposal is not None and status.proposal.preset == "q8_0-c512", status.proposal
        request_id = f"campaign-{spec.id}-escalation-1"
        with pytest.raises(CampaignRefused, match="may not decide"):
            await tickets.decide(
                temporal_client,
                Decision(request_id=request_id, option="adopt", decided_by="mallory"),
                store=sqlite_engine,
            )
        with pytest.raises(CampaignRefused, match="unknown option"):
            await tickets.decide(
                temporal_client,
                Decision(request_id=request_id, option="maybe", decided_by="wayne"),
                store=sqlite_engine,
            )
        with session_scope(sqlite_engine) as session:
            [pending] = queries.decisions(session=session, pending=True)
            assert pending.request_id == request_id and pending.deciders == ["wayne"]
        answered = await tickets.decide(
            temporal_client,
            Decision(request_id=request_id, option="adopt", decided_by="wayne", note="speed is neutral"),
            store=sqlite_engine,
        )
        assert isinstance(answered, CampaignStatus) and answered.decision == "adopt"
        final = await handle.result()
        history = await handle.fetch_history()
    assert final.status == "adopted"
    # the fresh history replays, and is kept (with DAEDALUS_RECORD_HISTORIES=1) for the stored-history test
    await replay_split_too(Replayer(workflows=[CampaignWorkflow], data_converter=DATA_CONVERTER), history)
    if os.environ.get("DAEDALUS_RECORD_HISTORIES"):
        (HISTORIES / "campaign-adopted.json").write_text(history.to_json())
    assert measured_cells == [c.key for c in spec.cells()], "cells are measured one by one, in order"
    with session_scope(sqlite_engine) as session:
        row = session.get(CampaignRow, spec.id)
        assert row is not None and row.status == "adopted" and row.proposal == "q8_0-c512"
        assert row.provenance["harness"].startswith("daedalus.engines.measure")
        cells = queries.campaign_cells(session=session, campaign_id=spec.id)
        assert len(cells) == 12 and sum(c.outcome == "crashed" for c in cells) == 2
        crashed = {c.key for c in spec.cells() if c.kv == "q8_0" and c.context == 1024}
        assert {c.cell for c in cells if c.feasible} == {c.key for c in spec.cells()} - crashed
        report = render_markdown(build_report(session=session, since=datetime.now(UTC) - timedelta(hours=1)))
        assert not queries.decisions(session=session, pending=True)
    assert "| q8_0 | context 1024, users 2 | crashed: llama-server exited with 134 at start |" in report
    assert "Proposed: **q8_0-c512**" in report
    assert "→ **adopt** by wayne via cli — “speed is neutral”" in report


leased: list[tuple[str, list[int] | None, list[tuple[str, list[int]]]]] = []


@activity.defn(name="measure_campaign_cell")
async def cell_seen_by_the_keeper(request: CellInput) -> CellResult:
    """Records the GPUs the cell was given and the leases its host's keeper holds while it measures."""
    state = await holder.keeper_state(activity.client(), request.spec.host)
    leased.append((request.cell.key, request.gpus, [(lease.holder, lease.gpus) for lease in state.held]))
    return CellResult(
        cell=request.cell,
        preset=request.cell.preset_name,
        label=request.spec.label(request.cell.kv),
        outcome=CellOutcome.MEASURED,
        decode_tps=50.0,
        ci_low=49.0,
        ci_high=51.0,
        samples=[49.0, 50.0, 51.0],
        kib_per_token={"f16": 8.0, "q8_0": 4.25}[request.cell.kv],
        needle_found=6,
        needle_total=6,
        measured_at=datetime.now(UTC),
    )


async def test_cells_run_under_a_lease_on_the_hosts_gpus_and_the_proposal_goes_through_the_desk(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    leased.clear()
    async with running_keeper(temporal_client, tmp_path, gpus=2, host_worker=False) as keeper:
        spec = load_campaign(EXAMPLES / "local-kv-matrix.yaml").model_copy(
            update={"host": keeper.host, "id": f"g-{task_queue[-8:]}", "reminder_interval_s": 1}
        )
        async with (
            running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, "elsewhere"),
            Worker(temporal_client, task_queue=host_queue(keeper.host), activities=[cell_seen_by_the_keeper]),
        ):
            handle = await temporal_client.start_workflow(
                CampaignWorkflow.run,
                CampaignInput(spec=spec, control_queue=task_queue, host_gpus=2),
                id=campaign_workflow_id(spec.id),
                task_queue=task_queue,
            )
            await wait_status(handle, "awaiting_decision")
            with session_scope(sqlite_engine) as session:
                [pending] = queries.decisions(session=session, pending=True)
            await asyncio.sleep(2.5)  # the desk reminds a waiting proposal
            await tickets.decide(
                temporal_client,
                Decision(request_id=pending.request_id, option="reject", decided_by="wayne"),
                store=sqlite_engine,
            )
            final = await handle.result()
            after = await holder.keeper_state(temporal_client, keeper.host)
        history = await handle.fetch_history()
    assert final.status == "rejected" and final.decision == "reject"
    assert [key for key, _, _ in leased] == [c.key for c in spec.cells()]
    for key, gpus, held in leased:
        # every cell was measured on both GPUs, while the keeper held exactly its lease on them
        assert gpus == [0, 1] and held == [(f"campaign {spec.id} cell {key}", [0, 1])], (key, gpus, held)
    assert after.held == []
    trail = events(sqlite_engine, campaign_workflow_id(spec.id))
    kinds = [e.kind for e in sorted(trail, key=lambda e: e.seq)]
    assert [e.seq for e in sorted(trail, key=lambda e: e.seq)] == list(range(1, len(trail) + 1))
    assert kinds[:2] == [AuditKind.FILED, AuditKind.DECISION_REQUESTED] and kinds[-1] == AuditKind.DECIDED
    assert AuditKind.DECISION_REMINDER in kinds
    await replay_split_too(Replayer(workflows=[CampaignWorkflow], data_converter=DATA_CONVERTER), history)


@pytest.mark.llama
async def test_real_cells_on_this_cpu_with_turbo3_not_runnable_on_the_stock_build(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"hw-{task_queue[-8:]}"
    spec = load_campaign(EXAMPLES / "local-wall.yaml").model_copy(
        update={"host": host, "id": f"w-{task_queue[-8:]}"}
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await temporal_client.start_workflow(
            CampaignWorkflow.run,
            CampaignInput(spec=spec, control_queue=task_queue),
            id=campaign_workflow_id(spec.id),
            task_queue=task_queue,
        )
        status = await wait_status(handle, "awaiting_decision", limit=280)
        await tickets.decide(
            temporal_client,
            Decision(request_id=f"campaign-{spec.id}-escalation-1", option="reject", decided_by="wayne"),
            store=sqlite_engine,
        )
        assert (await handle.result()).status == "rejected"
    assert status.proposal is not None and status.proposal.preset == "f16-c256"
    with session_scope(sqlite_engine) as session:
        f16, turbo3 = queries.campaign_cells(session=session, campaign_id=spec.id)
    assert f16.outcome == "measured" and f16.decode_tps is not None and f16.decode_tps > 0
    assert f16.ci_low is not None and f16.ci_low <= f16.decode_tps <= (f16.ci_high or 0)
    assert len(f16.samples) == spec.rounds and f16.kib_per_token is not None and f16.kib_per_token > 0
    # the fork's type on the stock build: not runnable here, with the reason, never a crash (a preset's wall)
    assert turbo3.outcome == "invalid" and turbo3.detail.startswith("not runnable on this build"), turbo3
    assert "KV type turbo3" in turbo3.detail and "turbo fork" in turbo3.detail, turbo3.detail


slow_cells: list[str] = []


@activity.defn(name="measure_campaign_cell")
async def slow_cell(request: CellInput) -> CellResult:
    """A cell that takes a while, so a cancel lands while it is being measured."""
    slow_cells.append(request.cell.key)
    await asyncio.sleep(0.5)
    return CellResult(
        cell=request.cell,
        preset=request.cell.preset_name,
        label=request.spec.label(request.cell.kv),
        outcome=CellOutcome.MEASURED,
        decode_tps=50.0,
        ci_low=49.0,
        ci_high=51.0,
        samples=[49.0, 50.0, 51.0],
        kib_per_token=8.0,
        needle_found=6,
        needle_total=6,
        measured_at=datetime.now(UTC),
    )


async def test_a_campaign_is_cancelled_by_a_decider_mid_sweep_and_says_who_and_why(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"hx-{task_queue[-8:]}"
    spec = load_campaign(EXAMPLES / "local-kv-matrix.yaml").model_copy(
        update={"host": host, "id": f"x-{task_queue[-8:]}"}
    )
    slow_cells.clear()
    async with (
        running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, "elsewhere"),
        Worker(temporal_client, task_queue=host_queue(host), activities=[slow_cell]),
    ):
        handle = await temporal_client.start_workflow(
            CampaignWorkflow.run,
            CampaignInput(spec=spec, control_queue=task_queue, filed_by="lead"),
            id=campaign_workflow_id(spec.id),
            task_queue=task_queue,
        )
        while not slow_cells:
            await asyncio.sleep(0.05)
        request = CancelRequest(requested_by="mallory", reason="mine now")
        with pytest.raises(
            CampaignRefused, match=r"mallory may not cancel campaign .*allowed: .*wayne.*lead"
        ):
            await campaigns.cancel(temporal_client, spec.id, request)
        await campaigns.cancel(
            temporal_client, spec.id, CancelRequest(requested_by="wayne", reason="wrong model")
        )
        with pytest.raises(CampaignRefused, match="refused"):
            await campaigns.cancel(
                temporal_client, spec.id, CancelRequest(requested_by="wayne", reason="again")
            )
        final = await handle.result()
    assert final.status == "cancelled" and 1 <= final.cells_done < final.cells_total
    assert len(slow_cells) == final.cells_done, "no cell starts after the cancel"
    closed = events(sqlite_engine, campaign_workflow_id(spec.id))[-1]
    assert closed.kind == AuditKind.CLOSED.value and closed.actor == "wayne"
    assert closed.summary == f"cancelled by wayne after {final.cells_done}/12 cells: wrong model"
    with session_scope(sqlite_engine) as session:
        row = session.get(CampaignRow, spec.id)
        assert row is not None and row.status == "cancelled"
        assert not queries.decisions(session=session, pending=True)


async def test_a_campaign_cancelled_while_its_proposal_waits_withdraws_the_request(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"hw-{task_queue[-8:]}"
    spec = load_campaign(EXAMPLES / "local-kv-matrix.yaml").model_copy(
        update={"host": host, "id": f"w-{task_queue[-8:]}"}
    )
    async with (
        running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, "elsewhere"),
        Worker(temporal_client, task_queue=host_queue(host), activities=[scripted_cell]),
    ):
        handle = await temporal_client.start_workflow(
            CampaignWorkflow.run,
            CampaignInput(spec=spec, control_queue=task_queue, filed_by="lead"),
            id=campaign_workflow_id(spec.id),
            task_queue=task_queue,
        )
        await wait_status(handle, "awaiting_decision")
        await campaigns.cancel(
            temporal_client, spec.id, CancelRequest(requested_by="lead", reason="superseded")
        )
        final = await handle.result()
    assert final.status == "cancelled" and final.cells_done == 12 and final.decision is None
    closed = events(sqlite_engine, campaign_workflow_id(spec.id))[-1]
    assert closed.actor == "lead" and closed.summary == "cancelled by lead after 12/12 cells: superseded"
    with session_scope(sqlite_engine) as session:
        assert not queries.decisions(session=session, pending=True)
        [withdrawn] = queries.decisions(session=session)
        assert withdrawn.note.startswith("withdrawn") and withdrawn.decided_by is None
