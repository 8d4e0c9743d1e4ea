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


def test_a_question_that_belongs_to_no_ticket_says_so_and_offers_its_own_options() -> None:
    from daedalus.decisions.schemas import QuestionSubject
    from daedalus.slack.blocks import parse_button_value

    request = DecisionRequest(
        id="dense-models-question-1",
        ticket_id="question:dense-models",
        kind=DecisionKind.QUESTION,
        question="Which dense models enter the pool?",
        options=["all-three", "screen-first"],
        deciders=["wayne"],
        requested_at=datetime(2026, 11, 30, tzinfo=UTC),
        subject=QuestionSubject(question="dense-models"),
    )
    blocks = [b.to_dict() for b in decision_blocks(request)]
    [head] = [b for b in blocks if b["block_id"] == "question:dense-models-question-1"]
    assert head["text"]["text"] == "*Question for the deciders* — Which dense models enter the pool?"
    [actions] = [b for b in blocks if b["block_id"] == "decide:dense-models-question-1"]
    values = [parse_button_value(button["value"]) for button in actions["elements"]]
    assert [(v.request_id, v.option) for v in values] == [
        ("dense-models-question-1", "all-three"),
        ("dense-models-question-1", "screen-first"),
    ]
