"""/tickets: file a ticket, list them, read one, and delegate, amend or cancel a live one."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from daedalus import services as tickets
from daedalus.api.context import ApiContext, Caller, Context, TemporalClient, require_same_person
from daedalus.api.errors import refusal, status_for, within
from daedalus.api.hosts import waiting_lines
from daedalus.api.models import Delegated, TicketDetail, TicketFiled, TicketSummary, VerdictPublic
from daedalus.errors import RequestRefused, TicketError
from daedalus.ids import ticket_workflow_id
from daedalus.schemas.audit import AuditEvent
from daedalus.schemas.ticket import (
    TICKET_ID_PATTERN,
    CancelRequest,
    Delegation,
    SpecAmendment,
    TerminateRequest,
    TicketSpec,
    TicketState,
    TicketStatus,
)
from daedalus.services import termination
from daedalus.store import queries
from daedalus.store.database import session_scope

router = APIRouter(prefix="/tickets", tags=["tickets"])
TicketId = Annotated[str, Path(pattern=TICKET_ID_PATTERN, description="a ticket id, e.g. `4`")]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TicketFiled)
async def file_ticket(
    spec: TicketSpec, caller: Caller, context: Context, client: TemporalClient
) -> TicketFiled:
    """File a ticket (the body is a ticket spec, as in a YAML file). 409 while a ticket with its id is live;
    403 when the server's policy does not let the caller file it as written (a spec that loosens its approval)."""
    registry = context.registry() if context.hosts_file is not None else None
    try:
        handle = await tickets.file_ticket(
            client,
            spec,
            queue=context.control_queue,
            filed_by=caller,
            hosts=registry,
            policy=context.policy,
            store=context.engine,
        )
    except RequestRefused as error:
        raise refusal(error) from error
    return TicketFiled(
        ticket_id=spec.id, workflow_id=handle.id, run_id=handle.first_execution_run_id, filed_by=caller
    )


@router.get("", response_model=list[TicketSummary])
async def list_tickets(
    _: Caller,
    context: Context,
    status_: Annotated[TicketStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[TicketSummary]:
    """Tickets from the store's projection, most recently changed first."""

    def read() -> list[TicketSummary]:
        with session_scope(context.engine) as session:
            rows = queries.list_tickets(
                session=session, status=status_.value if status_ else None, limit=limit
            )
            return [TicketSummary.model_validate(row) for row in rows]

    return await _with_waiting(context, await asyncio.to_thread(read))


async def _with_waiting(context: ApiContext, summaries: list[TicketSummary]) -> list[TicketSummary]:
    """The summaries, each stuck on a host no worker polls saying so (`waiting_on_host`)."""
    lines = await waiting_lines(context, summaries)
    return [s.model_copy(update={"waiting_on_host": lines.get(s.ticket_id)}) for s in summaries]


@router.get("/{ticket_id}", response_model=TicketDetail)
async def show_ticket(
    ticket_id: TicketId, _: Caller, context: Context, client: TemporalClient
) -> TicketDetail:
    """Live state from Temporal (the `state` query) with the verdicts and projection from the store."""

    def read() -> tuple[TicketSummary | None, list[VerdictPublic]]:
        with session_scope(context.engine) as session:
            row = queries.get_ticket(session=session, ticket_id=ticket_id)
            found = queries.verdicts(session=session, ticket_id=ticket_id)
            return (
                TicketSummary.model_validate(row) if row else None,
                [VerdictPublic.model_validate(v) for v in found],
            )

    live: TicketState | None = None
    missing: RequestRefused | None = None
    try:
        live = await live_state(client, ticket_id, context.settings.update_timeout_s)
    except RequestRefused as error:
        missing = error
    projection, verdicts = await asyncio.to_thread(read)
    if live is None and projection is None:
        if missing is not None and status_for(missing) != status.HTTP_404_NOT_FOUND:
            raise refusal(missing)
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no ticket {ticket_id!r}: Temporal has no workflow {ticket_workflow_id(ticket_id)} and the store "
            f"has no record of it; `GET /tickets` lists the known ones",
        )
    if projection is not None:
        [projection] = await _with_waiting(context, [projection])
    return TicketDetail(
        ticket_id=ticket_id,
        workflow_id=ticket_workflow_id(ticket_id),
        live=live,
        projection=projection,
        verdicts=verdicts,
    )


async def live_state(client: Client, ticket_id: str, timeout_s: float) -> TicketState | None:
    """A closed ticket's final state from its history (no worker needed); a running one's from the `state`
    query. None when Temporal cannot answer in time (a running ticket with no worker polling its queue)."""
    handle = client.get_workflow_handle(ticket_workflow_id(ticket_id), result_type=TicketState)
    try:
        description = await handle.describe()
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise TicketError(f"no ticket {ticket_id} in Temporal") from error
        raise TicketError(f"ticket {ticket_id}: {error.message}") from error
    if description.status is WorkflowExecutionStatus.COMPLETED:
        try:
            return await handle.result()
        except WorkflowFailureError:
            return None
    try:
        return await within(tickets.status(client, ticket_id), timeout_s, ticket_id)
    except (RequestRefused, HTTPException):
        return None


@router.post("/{ticket_id}/delegations", response_model=Delegated)
async def delegate(
    ticket_id: TicketId, delegation: Delegation, caller: Caller, context: Context, client: TemporalClient
) -> Delegated:
    """A decider lets someone else decide one kind of decision; `granted_by` must be the caller."""
    require_same_person(caller, delegation.granted_by, "granted_by")
    delegation = delegation.model_copy(update={"channel": "api"})
    try:
        people = await within(
            tickets.delegate(client, ticket_id, delegation, policy=context.policy),
            context.settings.update_timeout_s,
            ticket_id,
        )
    except RequestRefused as error:
        raise refusal(error) from error
    return Delegated(ticket_id=ticket_id, kind=delegation.kind.value, delegates=people)


@router.post("/{ticket_id}/amendments", response_model=TicketState)
async def amend(
    ticket_id: TicketId, amendment: SpecAmendment, caller: Caller, context: Context, client: TemporalClient
) -> TicketState:
    """Change a live ticket's brief, constraints or attempt budget; `amended_by` must be the caller."""
    require_same_person(caller, amendment.amended_by, "amended_by")
    try:
        return await within(
            tickets.amend(client, ticket_id, amendment), context.settings.update_timeout_s, ticket_id
        )
    except RequestRefused as error:
        raise refusal(error) from error


@router.post("/{ticket_id}/terminate", response_model=list[AuditEvent])
async def terminate(
    ticket_id: TicketId, request: TerminateRequest, caller: Caller, context: Context, client: TemporalClient
) -> list[AuditEvent]:
    """Last resort for a wedged ticket: terminate its workflow and write the closing audit events (status
    `terminated`); `requested_by` must be the caller, a decider or an operator of the ticket's host."""
    require_same_person(caller, request.requested_by, "requested_by")
    try:
        return await termination.terminate(
            client,
            ticket_id,
            by=request.requested_by,
            reason=request.reason,
            store=context.engine,
            key=context.require_audit_key(),
            policy=context.policy,
        )
    except RequestRefused as error:
        raise refusal(error) from error


@router.post("/{ticket_id}/cancel", response_model=TicketState)
async def cancel(
    ticket_id: TicketId, request: CancelRequest, caller: Caller, context: Context, client: TemporalClient
) -> TicketState:
    """Cancel a live ticket (its running step too); `requested_by` must be the caller."""
    require_same_person(caller, request.requested_by, "requested_by")
    try:
        return await within(
            tickets.cancel(client, ticket_id, request), context.settings.update_timeout_s, ticket_id
        )
    except RequestRefused as error:
        raise refusal(error) from error
