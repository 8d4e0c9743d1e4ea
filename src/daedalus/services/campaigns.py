"""Campaigns as every entry point changes them: cancelling a running one (starting is `daedalus campaign start`)."""

from __future__ import annotations

from temporalio.client import Client

from daedalus.schemas.campaigns import CampaignStatus, campaign_workflow_id
from daedalus.schemas.ticket import CancelRequest
from daedalus.services._temporal import CampaignRefused, update
from daedalus.workflows.campaign import CampaignWorkflow


async def cancel(client: Client, campaign_id: str, request: CancelRequest) -> CampaignStatus:
    """Stop the campaign after the cell it is measuring (or its waiting proposal); a decider of the campaign
    or whoever started it may."""
    result: CampaignStatus = await update(
        client,
        campaign_workflow_id(campaign_id),
        f"campaign {campaign_id}",
        CampaignWorkflow.cancel,
        request,
        refused=CampaignRefused,
    )
    return result
