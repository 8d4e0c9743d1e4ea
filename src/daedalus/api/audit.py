"""/audit: the audit trail from the store, filtered by ticket, actor and time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from daedalus.api.context import Caller, Context
from daedalus.api.models import AuditEventPublic
from daedalus.store import queries
from daedalus.store.database import session_scope

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get("", response_model=list[AuditEventPublic])
async def audit(
    _: Caller,
    context: Context,
    ticket: Annotated[str | None, Query(description="a ticket id (or training-<name>)")] = None,
    actor: Annotated[str | None, Query(description="who acted: a person, `daedalus`, `cli` ...")] = None,
    since: Annotated[
        datetime | None, Query(description="ISO 8601; without an offset it is read as UTC")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
) -> list[AuditEventPublic]:
    """Events oldest first."""
    if since is not None:
        since = since.replace(tzinfo=UTC) if since.tzinfo is None else since.astimezone(UTC)

    def read() -> list[AuditEventPublic]:
        with session_scope(context.engine) as session:
            rows = queries.audit_events(
                session=session, ticket_id=ticket, actor=actor, since=since, limit=limit
            )
            return [AuditEventPublic.model_validate(row) for row in rows]

    return await asyncio.to_thread(read)
