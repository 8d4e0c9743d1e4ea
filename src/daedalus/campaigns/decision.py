"""The campaign's one decision: adopt the proposed preset or not. The decision desk asks it about a
`CampaignSubject` (request id `campaign-<id>-escalation-1`), so `services.decide` routes the answer to the
campaign's workflow."""

from __future__ import annotations

from daedalus.schemas.campaigns import CampaignSpec, Proposal


def proposal_question(
    spec: CampaignSpec, proposal: Proposal, *, cells: int, crashed: int
) -> tuple[str, list[str]]:
    """The question put to the deciders, and its evidence."""
    question = (
        f"Campaign {spec.id} ({spec.title}) on {spec.host} proposes preset {proposal.preset}; adopt it?"
    )
    evidence = [proposal.reason, f"{cells} cells measured, {crashed} crashed; the matrix is in the report"]
    return question, evidence
