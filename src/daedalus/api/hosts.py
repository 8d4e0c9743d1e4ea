"""/hosts: what `daedalus hosts` shows: each host's workers polling, backlog, leases held and waiting, tenants."""

from __future__ import annotations

from fastapi import APIRouter

from daedalus.api.context import Caller, Context, TemporalClient
from daedalus.hosts.status import HostView, describe_hosts

router = APIRouter(prefix="/hosts", tags=["hosts"])


@router.get("", response_model=list[HostView])
async def list_hosts(_: Caller, context: Context, client: TemporalClient) -> list[HostView]:
    """Every host in the registry with Temporal's view of its queue and its lease keeper's state."""
    return await describe_hosts(client, context.registry(), client.namespace)
