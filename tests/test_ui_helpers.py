"""The Temporal UI helpers: awaiting as a list of people, the closed outcome in words, short summaries."""

from __future__ import annotations

from daedalus.schemas.ticket import TicketStatus
from daedalus.schemas.ui import (
    SUMMARY_LIMIT,
    awaiting_people,
    current_details,
    gate_activity_summary,
    outcome_label,
)


def test_awaiting_becomes_one_entry_per_person() -> None:
    assert awaiting_people("wayne,lead") == ["wayne", "lead"]
    assert awaiting_people(" Wayne , lead,wayne,") == ["wayne", "lead"]
    assert awaiting_people(None) == [] and awaiting_people("") == []
    assert awaiting_people(["lead", "Lead"]) == ["lead"]


def test_every_closed_status_has_an_outcome_and_no_open_one_does() -> None:
    for status in TicketStatus:
        assert (outcome_label(status) is not None) == status.is_closed, status
    assert outcome_label("closed_under_exception") == "closed under exception"
    assert outcome_label("no-such-status") is None


def test_details_name_the_outcome_or_what_happens_now_and_summaries_stay_short() -> None:
    assert len(gate_activity_summary("decode", "x" * 500, attempt=1)) == SUMMARY_LIMIT
    assert (
        current_details("gating", gate="decode", attempt=2)
        == "**gating**\n\nattempt 2\n\nmeasuring gate `decode`"
    )
    assert current_details("failed", reason="the same failure twice").startswith("**❌ failed**")
    assert (
        gate_activity_summary("decode", "decode_tps >= 55", attempt=2)
        == "gate decode: decode_tps >= 55 (attempt 2, round 1)"
    )
