"""Search attributes that mirror a ticket's state in the Temporal UI (List Filter: DaedalusStatus="gating")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

if TYPE_CHECKING:
    from daedalus.schemas.ticket import TicketSpec

TICKET_ID = SearchAttributeKey.for_keyword("DaedalusTicketId")
STATUS = SearchAttributeKey.for_keyword("DaedalusStatus")
ENGINE = SearchAttributeKey.for_keyword("DaedalusEngine")
HOST = SearchAttributeKey.for_keyword("DaedalusHost")
AGENT = SearchAttributeKey.for_keyword("DaedalusAgent")
AWAITING = SearchAttributeKey.for_keyword("DaedalusAwaiting")

SEARCH_ATTRIBUTES = (TICKET_ID, STATUS, ENGINE, HOST, AGENT, AWAITING)


def ticket_identity(spec: TicketSpec) -> dict[SearchAttributeKey[str], str]:
    """The attributes fixed for a ticket's whole life."""
    return {
        TICKET_ID: spec.id,
        HOST: spec.host,
        ENGINE: spec.engine.name if spec.engine else "none",
        AGENT: spec.agent.name.value if spec.agent else "none",
    }


def at_start(spec: TicketSpec) -> TypedSearchAttributes:
    """Given with the start request, so that the workflow needs no upsert of its own for them."""
    return TypedSearchAttributes(
        [SearchAttributePair(key, value) for key, value in ticket_identity(spec).items()]
    )
