"""The campaign's one decision: adopt the proposed preset or not. Kept in this one place so it can move to the
shared decisions package when that lands (it uses today's DecisionRequest shape)."""

from __future__ import annotations

from datetime import datetime

from daedalus.schemas.campaigns import CAMPAIGN_PREFIX, CampaignSpec, Proposal
from daedalus.schemas.ticket import DecisionKind, DecisionRequest

ADOPT, REJECT = "adopt", "reject"


def adoption_request(
    spec: CampaignSpec, proposal: Proposal, *, at: datetime, cells: int, crashed: int
) -> DecisionRequest:
    subject = f"{CAMPAIGN_PREFIX}{spec.id}"
    return DecisionRequest(
        id=f"{subject}-{DecisionKind.ESCALATION.value}-1",  # the id grammar `daedalus decide` routes by
        ticket_id=subject,
        # today's kinds are dispatch and escalation; a campaign's proposal is escalated to the decider
        kind=DecisionKind.ESCALATION,
        question=f"Campaign {spec.id} ({spec.title}) on {spec.host} proposes preset {proposal.preset}; adopt it?",
        options=[ADOPT, REJECT],
        evidence=[proposal.reason, f"{cells} cells measured, {crashed} crashed; the matrix is in the report"],
        deciders=spec.deciders,
        requested_at=at,
    )
