"""Who a decision request's Slack message names: who may answer it, never the filer excluded from their own
dispatch (even when a decider)."""

from __future__ import annotations

from datetime import UTC, datetime

from daedalus.schemas.ticket import DecisionKind, DecisionRequest
from daedalus.slack.blocks import decision_blocks


def test_the_message_names_who_may_answer_never_the_excluded_filer() -> None:
    request = DecisionRequest(
        id="t9-dispatch-1",
        ticket_id="t9",
        kind=DecisionKind.DISPATCH,
        question="Dispatch ticket t9?",
        options=["approve", "reject"],
        deciders=["wayne", "viewer"],
        delegates=["lead"],
        excluded=["wayne"],
        requested_at=datetime(2026, 11, 30, tzinfo=UTC),
    )
    [who] = [b.to_dict() for b in decision_blocks(request) if b.block_id == "who:t9-dispatch-1"]
    said = str(who)
    assert "viewer, lead" in said and "wayne" not in said
