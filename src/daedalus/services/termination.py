"""The last resort for a wedged ticket: terminate its workflow, then close its audit trail from here.

A terminated workflow writes nothing more, so the service layer writes the closing event itself (status
`terminated`), chained onto the trail like every other event, so the trail ends closed and `daedalus audit
verify` still passes. Sub-tickets that Temporal terminated with their parent get theirs too. Only a decider of the
policy, or an operator of the ticket's host, may do it (without a policy: a decider of the ticket's spec).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from pydantic import ValidationError
from sqlalchemy import Engine, func
from sqlmodel import Session, select
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from daedalus.decisions.policy import Policy, Role
from daedalus.errors import NotAllowed
from daedalus.ids import ticket_workflow_id
from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord, TicketSnapshot
from daedalus.schemas.ticket import TicketSpec, TicketStatus
from daedalus.services._temporal import TicketError
from daedalus.store import records
from daedalus.store.database import session_scope
from daedalus.store.seals import AuditKey
from daedalus.store.tables import AuditEventRow, TicketRow


async def terminate(
    client: Client,
    ticket_id: str,
    *,
    by: str,
    reason: str,
    store: Engine,
    key: AuditKey,
    policy: Policy | None,
) -> list[AuditEvent]:
    """Terminate `ticket-<id>` and write the closing events (its own first, then its sub-tickets')."""
    by = by.lower()
    handle = client.get_workflow_handle(ticket_workflow_id(ticket_id))
    description = await _describe(client, ticket_id)
    if description is None:
        raise TicketError(f"no ticket {ticket_id} in Temporal; `daedalus ticket list` shows the known ones")
    if description.status is not WorkflowExecutionStatus.RUNNING:
        state = description.status.name.lower() if description.status else "closed"
        raise TicketError(
            f"ticket {ticket_id} is not running (workflow {state}); there is nothing to terminate"
        )
    row = await asyncio.to_thread(_ticket_row, store, ticket_id)
    _require_authority(policy, by, ticket_id, row)
    why = f"terminated by {by}: {reason}"
    try:
        await handle.terminate(reason=why)
    except RPCError as error:
        raise TicketError(f"Temporal did not terminate ticket {ticket_id}: {error.message}") from error
    closed = [await asyncio.to_thread(_close_trail, store, key, ticket_id, description, row, by, why)]
    for child in _children(row):
        found = await _describe(client, child)
        if found is not None and found.status is WorkflowExecutionStatus.TERMINATED:
            child_row = await asyncio.to_thread(_ticket_row, store, child)
            if child_row is None or not TicketStatus(child_row.status).is_closed:
                closed.append(
                    await asyncio.to_thread(
                        _close_trail,
                        store,
                        key,
                        child,
                        found,
                        child_row,
                        by,
                        f"{why} (with parent {ticket_id})",
                    )
                )
    return closed


async def _describe(client: Client, ticket_id: str) -> WorkflowExecutionDescription | None:
    try:
        return await client.get_workflow_handle(ticket_workflow_id(ticket_id)).describe()
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            return None
        raise TicketError(f"cannot reach ticket {ticket_id}: {error.message}") from error


def _ticket_row(store: Engine, ticket_id: str) -> TicketRow | None:
    with session_scope(store) as session:
        row = session.get(TicketRow, ticket_id)
        if row is not None:
            session.expunge(row)
        return row


def _require_authority(policy: Policy | None, by: str, ticket_id: str, row: TicketRow | None) -> None:
    host = row.host if row is not None else ""
    if policy is not None:
        if policy.may_terminate(by, host):
            return
        operators = policy.hosts[host].operators if host in policy.hosts else []
        raise NotAllowed(
            f"{by} may not terminate ticket {ticket_id}: only deciders {policy.with_role(Role.DECIDER)} and "
            f"operators of {host or 'its host'} {operators} may (try `daedalus ticket cancel` first)"
        )
    spec = _spec(row)
    deciders = spec.approval.deciders if spec is not None else []
    if by not in deciders:
        raise NotAllowed(f"{by} may not terminate ticket {ticket_id}; its deciders may: {deciders}")


def _spec(row: TicketRow | None) -> TicketSpec | None:
    if row is None or not row.spec:
        return None
    try:
        return TicketSpec.model_validate(row.spec)
    except ValidationError:
        return None


def _children(row: TicketRow | None) -> list[str]:
    spec = _spec(row)
    return [] if spec is None else [ticket.id for ticket in spec.tree()[1:]]


def _close_trail(
    store: Engine,
    key: AuditKey,
    ticket_id: str,
    description: WorkflowExecutionDescription,
    row: TicketRow | None,
    by: str,
    why: str,
) -> AuditEvent:
    """Write the closing event after the trail's last one, with the projection moved to `terminated`."""
    first_run = (
        row.run_id if row is not None else description.raw_description.workflow_execution_info.first_run_id
    )
    with session_scope(store) as session:
        event = AuditEvent(
            workflow_id=description.id,
            run_id=first_run,
            seq=_last_seq(session, first_run) + 1,
            ticket_id=ticket_id,
            kind=AuditKind.CLOSED,
            actor=by,
            at=datetime.now(UTC),
            status=TicketStatus.TERMINATED.value,
            summary=f"closed {TicketStatus.TERMINATED.value}: {why}",
            detail={"terminated_run": description.run_id or ""},
        )
        snapshot = None
        if row is not None:
            values = row.model_dump(include=set(TicketSnapshot.model_fields) - {"spec"})
            snapshot = TicketSnapshot(
                **{**values, "status": event.status, "awaiting": None, "outcome_reason": why}
            )
        records.apply(session=session, record=AuditRecord(event=event, ticket=snapshot), key=key)
    return event


def _last_seq(session: Session, run_id: str) -> int:
    found = session.exec(select(func.max(AuditEventRow.seq)).where(AuditEventRow.run_id == run_id)).first()
    return found or 0
