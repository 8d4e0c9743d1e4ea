"""Search attributes that mirror a ticket's state in the Temporal UI (List Filter: DaedalusStatus="gating").

`DaedalusWaitingFor` is a KeywordList, one entry per person who may answer the pending decision, so
`DaedalusWaitingFor = "wayne"` finds every ticket waiting for Wayne whether or not he delegated. It has a new name
because the Keyword `DaedalusAwaiting` ("wayne,lead" in one string) may already be registered on a server, and a
registered attribute never changes type (the dev server silently keeps the old one). New code never writes
`DaedalusAwaiting`; it clears it on tickets that started with it (`LEGACY_AWAITING`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from temporalio.common import (
    SearchAttributeIndexedValueType,
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
)

if TYPE_CHECKING:
    from daedalus.schemas.ticket import TicketSpec

TICKET_ID = SearchAttributeKey.for_keyword("DaedalusTicketId")
TITLE = SearchAttributeKey.for_keyword("DaedalusTitle")
"""The ticket's title, for the Temporal UI's workflow list: UI 2.54 has no column for the static summary, but it
shows any search attribute as a column (the read-only proxy adds this one by default, readonly_ui.py)."""
TITLE_CHARS = 200
STATUS = SearchAttributeKey.for_keyword("DaedalusStatus")
ENGINE = SearchAttributeKey.for_keyword("DaedalusEngine")
HOST = SearchAttributeKey.for_keyword("DaedalusHost")
AGENT = SearchAttributeKey.for_keyword("DaedalusAgent")
WAITING_FOR = SearchAttributeKey.for_keyword_list("DaedalusWaitingFor")
OUTCOME = SearchAttributeKey.for_keyword("DaedalusOutcome")
"""How a closed ticket ended, in words ("passed", "failed", "closed under exception"...): Temporal shows every
closed ticket as COMPLETED, because a failed gate is the ticket's finding, not a failure of its workflow."""
LEGACY_AWAITING = SearchAttributeKey.for_keyword("DaedalusAwaiting")
"""Written by tickets filed before `DaedalusWaitingFor`; cleared, never registered on a new server."""

SEARCH_ATTRIBUTES: tuple[SearchAttributeKey[Any], ...] = (
    TICKET_ID,
    TITLE,
    STATUS,
    ENGINE,
    HOST,
    AGENT,
    WAITING_FOR,
    OUTCOME,
)
TYPE_NAMES = {
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
}
"""How `temporal server start-dev --search-attribute` and `temporal operator search-attribute create` spell them."""


def registration(key: SearchAttributeKey[Any]) -> str:
    """`DaedalusWaitingFor=KeywordList`: the dev server's `--search-attribute` argument for `key`."""
    return f"{key.name}={TYPE_NAMES[key.indexed_value_type]}"


def ticket_identity(spec: TicketSpec) -> dict[SearchAttributeKey[Any], Any]:
    """The attributes fixed for a ticket's whole life."""
    return {
        TICKET_ID: spec.id,
        HOST: spec.host,
        ENGINE: spec.engine.name if spec.engine else "none",
        AGENT: spec.agent.name.value if spec.agent else "none",
    }


def at_start(spec: TicketSpec) -> TypedSearchAttributes:
    """Given with the start request, so that the workflow needs no upsert of its own for them. The title is
    given only here, never upserted: a ticket started without it keeps its history's commands as they were."""
    fixed = {**ticket_identity(spec), TITLE: spec.title[:TITLE_CHARS]}
    return TypedSearchAttributes([SearchAttributePair(key, value) for key, value in fixed.items()])


def on_host(host: str) -> TypedSearchAttributes:
    """A training run's or a campaign's attributes at start: only its host (`DaedalusHost = "gpu-1"` lists
    everything on the host); neither upserts a status of its own."""
    return TypedSearchAttributes([SearchAttributePair(HOST, host)])
