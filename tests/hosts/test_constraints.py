"""Standing constraints: a preset that breaks a live one is refused at launch with the reason; the constraint
lifts when its ticket passes (read from the store, or at once by the ticket_passed signal)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session
from temporalio.client import Client

from daedalus.hosts import holder
from daedalus.hosts.leases import LeaseRequest, PresetFacts
from daedalus.hosts.registry import Constraint
from daedalus.store.tables import TicketRow
from tests.hosts.keeper_support import running_keeper

CAP = Constraint.model_validate(
    {
        "id": "pool-16k-cap",
        "setting": "max_model_len",
        "op": "<=",
        "value": 16384,
        "until_ticket": "5",
        "reason": "the TQ workspace OOMs past 16K",
    }
)


def launch(lease_id: str, engine: str, **fields: object) -> LeaseRequest:
    return LeaseRequest(
        lease_id=lease_id,
        holder=f"launch {lease_id}",
        purpose="launch",
        count=1,
        ttl_s=10,
        preset=PresetFacts(engine=engine, name=lease_id, fields=dict(fields)),
    )


def ticket_row(ticket_id: str, status: str) -> TicketRow:
    now = datetime.now(UTC)
    return TicketRow(
        ticket_id=ticket_id,
        workflow_id=f"ticket-{ticket_id}",
        run_id="r",
        title="t",
        kind="fix",
        host="mavis",
        status=status,
        filed_at=now,
        updated_at=now,
    )


async def test_a_preset_breaking_a_live_constraint_is_refused_until_the_ticket_passes(
    temporal_client: Client, tmp_path: Path, sqlite_engine: Engine
) -> None:
    with Session(sqlite_engine) as session:
        session.add(ticket_row("5", "dispatched"))
        session.commit()
    async with running_keeper(
        temporal_client, tmp_path, constraints=[CAP], engine=sqlite_engine, constraint_poll_s=0.3
    ) as keeper:
        with pytest.raises(
            holder.LeaseRefused,
            match=r"preset long is refused: max_model_len=32768 breaks pool-16k-cap: max_model_len <= 16384 "
            r"until ticket 5 passes \(the TQ workspace OOMs past 16K\)",
        ):
            await holder.acquire(temporal_client, keeper.host, launch("long", "vllm", max_model_len=32768))
        with pytest.raises(holder.LeaseRefused, match="context=65536 breaks pool-16k-cap"):
            await holder.acquire(temporal_client, keeper.host, launch("llama", "llama.cpp", context=65536))
        ok = await holder.acquire(temporal_client, keeper.host, launch("cap", "vllm", max_model_len=16384))
        await holder.release(temporal_client, keeper.host, ok.lease_id)
        await asyncio.sleep(1.0)  # polls see ticket 5 still open
        with pytest.raises(holder.LeaseRefused):
            await holder.acquire(temporal_client, keeper.host, launch("long", "vllm", max_model_len=32768))
        with Session(sqlite_engine) as session:
            row = session.get(TicketRow, "5")
            assert row is not None
            row.status = "passed"
            session.add(row)
            session.commit()
        for _ in range(50):
            state = await holder.keeper_state(temporal_client, keeper.host)
            if not state.live_constraints():
                break
            await asyncio.sleep(0.1)
        assert state.passed_tickets == ["5"]
        assert any("ticket 5 passed" in e.detail for e in state.events)
        granted = await holder.acquire(
            temporal_client, keeper.host, launch("long", "vllm", max_model_len=32768)
        )
        assert granted.gpus


async def test_the_ticket_passed_signal_lifts_at_once(temporal_client: Client, tmp_path: Path) -> None:
    async with running_keeper(temporal_client, tmp_path, constraints=[CAP]) as keeper:
        with pytest.raises(holder.LeaseRefused, match="breaks pool-16k-cap"):
            await holder.acquire(temporal_client, keeper.host, launch("long", "vllm", max_model_len=65536))
        await holder.ticket_passed(temporal_client, keeper.registry, "5")
        granted = await holder.acquire(
            temporal_client, keeper.host, launch("long", "vllm", max_model_len=65536)
        )
        assert granted.gpus == [0]
