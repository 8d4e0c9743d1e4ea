"""Campaign steps: measure one cell on the host (host queue), store the matrix (control queue)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from sqlalchemy import Engine
from temporalio import activity

from daedalus.campaigns.cells import cell_dirname, measure_cell
from daedalus.schemas.campaigns import CampaignRecord, CellInput, CellResult
from daedalus.store import campaigns as campaign_store
from daedalus.store.database import session_scope

HEARTBEAT_S = 5.0


class CampaignCellActivities:
    """Host side. A cell's result is kept on disk: a retried activity hands it back instead of measuring again."""

    def __init__(self, artifacts: Path):
        self.artifacts = artifacts

    def cell_dir(self, request: CellInput) -> Path:
        return (
            self.artifacts
            / "campaigns"
            / request.campaign_id
            / (request.filing or "adhoc")
            / cell_dirname(request.cell)
        )

    @activity.defn(name="measure_campaign_cell")
    async def measure_campaign_cell(self, request: CellInput) -> CellResult:
        workdir = self.cell_dir(request)
        done = workdir / "result.json"
        if done.exists():
            return CellResult.model_validate_json(done.read_text())
        beating = asyncio.create_task(_heartbeat(request.cell.key))
        try:
            result = await measure_cell(
                request.spec, request.cell, workdir, host=request.spec.host, gpus=request.gpus
            )
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
        done.write_text(result.model_dump_json(indent=2))
        return result


async def _heartbeat(cell: str) -> None:
    while True:
        activity.heartbeat(cell)
        await asyncio.sleep(HEARTBEAT_S)


class CampaignStoreActivities:
    def __init__(self, engine: Engine):
        self.engine = engine

    @activity.defn(name="record_campaign")
    async def record_campaign(self, record: CampaignRecord) -> None:
        """Store the campaign's state and its new cells; a retry adds nothing twice."""
        await asyncio.to_thread(self._save, record)

    def _save(self, record: CampaignRecord) -> None:
        with session_scope(self.engine) as session:
            campaign_store.save(session=session, record=record)
