"""/hosts: what `daedalus hosts` shows: each host's workers polling, backlog, leases held and waiting, tenants."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, HTTPException

from daedalus.api.context import ApiContext, Caller, Context, TemporalClient
from daedalus.hosts.status import ON_A_HOST, HostView, TicketOnHost, describe_hosts, waiting_on_hosts

router = APIRouter(prefix="/hosts", tags=["hosts"])


@router.get("", response_model=list[HostView])
async def list_hosts(_: Caller, context: Context, client: TemporalClient) -> list[HostView]:
    """Every host in the registry with Temporal's view of its queue and its lease keeper's state."""
    return await describe_hosts(client, context.registry(), client.namespace)


async def waiting_lines(context: ApiContext, tickets: Sequence[TicketOnHost]) -> dict[str, str]:
    """ticket id -> "queued for host-mavis since 22:03 UTC; no worker polls it; ..." for each ticket stuck on a host
    no worker polls. Empty without a registry, or when Temporal cannot be reached: the store's answer stands."""
    if context.hosts_file is None or not any(t.status in ON_A_HOST for t in tickets):
        return {}
    try:
        client = await context.client()
        return await waiting_on_hosts(client, context.registry(), tickets, client.namespace)
    except HTTPException:
        return {}
