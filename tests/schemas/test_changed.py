"""Workflow state changes through `Model.changed`, which validates what `model_copy(update=...)` would store blindly."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from daedalus.schemas.ticket import AttemptOutcome, TicketCarry, TicketStatus


def test_changed_validates_and_leaves_the_original_as_it_was() -> None:
    carry = TicketCarry()
    moved = carry.changed(status=TicketStatus.BUILDING, continued=2)
    assert moved.status is TicketStatus.BUILDING and moved.continued == 2
    assert carry.status is TicketStatus.DRAFT and carry.continued == 0
    assert moved.changed(status="passed").status is TicketStatus.PASSED  # coerced as on construction


def test_a_misspelt_field_or_a_wrong_type_is_refused() -> None:
    carry = TicketCarry()
    with pytest.raises(ValidationError, match="statuss"):
        carry.changed(statuss=TicketStatus.PASSED)
    with pytest.raises(ValidationError, match="continued"):
        carry.changed(continued=-1)
    with pytest.raises(ValidationError, match="status"):
        carry.changed(status=AttemptOutcome.COMMITTED)
    # what the old way stored without a word:
    assert carry.model_copy(update={"statuss": "x"}).status is TicketStatus.DRAFT
