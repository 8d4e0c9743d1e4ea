"""The one authority check every `decide` validator runs, and where a server-side policy plugs in."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import TypeAdapter, ValidationError

from daedalus.decisions.authority import refusal
from daedalus.decisions.schemas import (
    CampaignSubject,
    Decision,
    DecisionKind,
    DecisionRequest,
    DecisionSubject,
    DispatchOption,
    TicketSubject,
    TrainingRunSubject,
)


def request() -> DecisionRequest:
    return DecisionRequest(
        id="4-dispatch-1",
        ticket_id="4",
        kind=DecisionKind.DISPATCH,
        question="Dispatch?",
        options=[o.value for o in DispatchOption],
        deciders=["wayne"],
        delegates=["lead"],
        requested_at=datetime(2026, 11, 30, tzinfo=UTC),
        subject=TicketSubject(ticket_id="4"),
    )


def answer(**changes: str) -> Decision:
    return Decision.model_validate(
        {"request_id": "4-dispatch-1", "option": "approve", "decided_by": "wayne", **changes}
    )


def test_a_decider_or_a_delegate_may_answer() -> None:
    assert refusal(request(), answer()) is None
    assert refusal(request(), answer(decided_by="lead")) is None


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        (
            {"request_id": "4-dispatch-2"},
            "unknown decision request '4-dispatch-2'; the pending one is '4-dispatch-1'",
        ),
        (
            {"option": "ship-it"},
            "unknown option 'ship-it' for 4-dispatch-1; choose one of ['approve', 'reject']",
        ),
        (
            {"decided_by": "mallory"},
            "mallory may not decide dispatch for ticket 4; allowed: ['wayne', 'lead']",
        ),
    ],
)
def test_refusals_say_why(changes: dict[str, str], why: str) -> None:
    assert refusal(request(), answer(**changes)) == why


def test_a_server_side_policy_plugs_in_after_the_requests_own_rules() -> None:
    def only_wayne_dispatches(req: DecisionRequest, decision: Decision) -> str | None:
        if req.kind is DecisionKind.DISPATCH and decision.decided_by != "wayne":
            return f"the server's policy lets only wayne dispatch, not {decision.decided_by}"
        return None

    assert refusal(request(), answer(decided_by="lead"), only_wayne_dispatches) == (
        "the server's policy lets only wayne dispatch, not lead"
    )
    assert refusal(request(), answer(), only_wayne_dispatches) is None
    # The request's own rules come first: the policy never sees an answer the request refuses.
    assert "mallory may not decide" in (
        refusal(request(), answer(decided_by="mallory"), only_wayne_dispatches) or ""
    )


def test_subjects_are_typed_and_name_their_workflow() -> None:
    adapter: TypeAdapter[DecisionSubject] = TypeAdapter(DecisionSubject)
    run = adapter.validate_json(TrainingRunSubject(run="drafter").model_dump_json())
    assert run == TrainingRunSubject(run="drafter") and run.workflow_id == "training-drafter"
    assert TicketSubject(ticket_id="4").workflow_id == "ticket-4"
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "lease", "run": "x"})


def test_a_channel_outside_the_known_ones_is_refused_at_the_boundary() -> None:
    with pytest.raises(ValidationError, match="channel"):
        answer(channel="carrier-pigeon")


def test_a_campaign_subject_routes_to_its_workflow_and_labels_refusals() -> None:
    adapter: TypeAdapter[DecisionSubject] = TypeAdapter(DecisionSubject)
    campaign = adapter.validate_json(CampaignSubject(campaign="c1").model_dump_json())
    assert campaign == CampaignSubject(campaign="c1") and campaign.workflow_id == "campaign-c1"
    asked = request().model_copy(update={"subject": campaign})
    assert refusal(asked, answer(decided_by="mallory")) == (
        "mallory may not decide dispatch for campaign c1; allowed: ['wayne', 'lead']"
    )
    assert refusal(asked, answer()) is None
