"""Write campaigns and their cells: an upsert keyed by campaign id and cell, so a retried write changes nothing."""

from __future__ import annotations

from sqlmodel import Session, select

from daedalus.schemas.campaigns import CampaignRecord, CellOutcome, CellResult, QualityConstraints
from daedalus.store.tables import CampaignCellRow, CampaignRow


def eligible(result: CellResult, constraints: QualityConstraints) -> bool:
    """Whether a measured cell meets the campaign's quality constraints (a crashed one never does)."""
    if result.outcome is not CellOutcome.MEASURED or result.decode_tps is None:
        return False
    if (
        result.needle_total
        and (result.needle_found or 0) / result.needle_total < constraints.min_needle_fraction
    ):
        return False
    if constraints.forbid_garbage and result.garbage:
        return False
    limit = constraints.max_ppl_delta_pct
    return limit is None or (result.ppl_delta_pct is not None and result.ppl_delta_pct <= limit)


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
                feasible=eligible(result, spec.constraints),
                **result.model_dump(exclude={"cell"}),
            )
        )
        stored.add(result.cell.key)
    session.flush()
