"""Search attributes that mirror a ticket's state in the Temporal UI (List Filter: DaedalusStatus="gating")."""

from temporalio.common import SearchAttributeKey

TICKET_ID = SearchAttributeKey.for_keyword("DaedalusTicketId")
STATUS = SearchAttributeKey.for_keyword("DaedalusStatus")
ENGINE = SearchAttributeKey.for_keyword("DaedalusEngine")
HOST = SearchAttributeKey.for_keyword("DaedalusHost")
AGENT = SearchAttributeKey.for_keyword("DaedalusAgent")
AWAITING = SearchAttributeKey.for_keyword("DaedalusAwaiting")

SEARCH_ATTRIBUTES = (TICKET_ID, STATUS, ENGINE, HOST, AGENT, AWAITING)
