"""Write campaigns and their cells: an upsert keyed by campaign id and cell, so a retried write changes nothing."""

from __future__ import annotations

from sqlmodel import Session, select

from daedalus.schemas.campaigns import CampaignRecord, CellResult
from daedalus.store.tables import CampaignCellRow, CampaignRow


def save(*, session: Session, record: CampaignRecord) -> None:
    """Create or move the campaign forward and add the cells not yet stored."""
    spec = record.spec
    row = session.get(CampaignRow, record.campaign_id)
    if row is None:
        row = CampaignRow(
            campaign_id=record.campaign_id,
            title=spec.title,
            host=spec.host,
            engine=record.provenance.get("engine", "llama.cpp"),
            model=spec.model,
            status=record.status,
            started_at=record.at,
            updated_at=record.at,
            spec=spec.model_dump(mode="json"),
            provenance=record.provenance,
        )
        session.add(row)
    elif record.at >= row.updated_at:
        row.status, row.updated_at = record.status, record.at
        row.provenance = {**row.provenance, **record.provenance}
    if record.proposal is not None:
        row.proposal, row.proposal_reason = record.proposal.preset, record.proposal.reason
        if row.finished_at is None and record.status != "awaiting_decision":
            row.finished_at = record.at
    stored = set(
        session.exec(select(CampaignCellRow.cell).where(CampaignCellRow.campaign_id == record.campaign_id))
    )
    for result in record.cells:
        if result.cell.key in stored:
            continue
        session.add(
            CampaignCellRow(
                campaign_id=record.campaign_id,
                cell=result.cell.key,
                axes=result.cell.axes(),
                feasible=result.cell.key in record.eligible,
                **result.model_dump(exclude={"cell", "evidence", *CellResult.STORED_IN_EVIDENCE}),
                evidence=result.stored_evidence(),
            )
        )
        stored.add(result.cell.key)
    if record.proposal is not None:
        # eligibility is known only when every cell is in (relative constraints compare with the baseline)
        session.flush()
        for cell in session.exec(
            select(CampaignCellRow).where(CampaignCellRow.campaign_id == record.campaign_id)
        ):
            cell.feasible = cell.cell in record.eligible
    session.flush()
