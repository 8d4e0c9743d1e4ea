"""Questions for the deciders that belong to no ticket ("which dense models enter the pool?", "may the fork get
a private backup remote?"), filed by a person or a bot, and the standing rulings some of them make.

A question is its own subject (`QuestionSubject`, workflow `question-<id>`, audit trail `question:<id>`): its
workflow asks through the same `DecisionDesk` as a ticket's escalation, so it is answered on every channel
(`daedalus decide`, `POST /decisions`, Slack, the console) and recorded in the same trail. It has a deadline:
when it passes unanswered, the question closes as expired with the outcome its filer set (`on_deadline`), or
none. A question may carry a `Rule` and name the option that enacts it; answered with that option, the rule
becomes a standing `Ruling` (who ruled, when), enforced at every later filing and campaign proposal.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from daedalus.decisions.rulings import Rule, Ruling
from daedalus.decisions.schemas import PERSON_PATTERN, DecisionRequest
from daedalus.schemas._base import Model, SpecModel
from daedalus.schemas.limits import LIST_ITEMS, Line, Note, Slug, Title

OPTION_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
QUESTION_DEADLINE_MAX = timedelta(days=90)
"""A question nobody may answer for a quarter is a typo, or no question."""
QUESTION_DEADLINE_MIN = timedelta(seconds=5)
RULING_DETAIL = "ruling"
"""Detail key of a `ruled` audit event: the Ruling as JSON (daedalus.store.questions reads them back)."""


class QuestionSpec(SpecModel):
    """What a person or a bot asks the deciders."""

    id: Slug = Field(description="names the question for ever (a question id is never asked twice)")
    question: Title = Field(description="the question, one line: 'Which dense models enter the pool?'")
    detail: Note = Field(default="", description="free text: the background a decider needs")
    options: list[str] = Field(
        min_length=2, max_length=16, description="the answers a decider may give, e.g. [approve, reject]"
    )
    evidence: list[Line] = Field(default_factory=list, max_length=LIST_ITEMS)
    deadline: datetime = Field(description="until when the question waits (with a timezone, e.g. ...Z)")
    on_deadline: str | None = Field(
        default=None,
        description="the outcome recorded when the deadline passes unanswered (one of options; none: expired)",
    )
    deciders: list[str] = Field(
        default_factory=list,
        max_length=LIST_ITEMS,
        description="who may answer; empty: the policy's deciders (required without a policy)",
    )
    reminder_interval_s: int | None = Field(default=None, ge=60, le=7 * 24 * 3600)
    rule: Rule | None = Field(default=None, description="the standing rule an answer may enact")
    revokes: list[Slug] = Field(
        default_factory=list,
        max_length=LIST_ITEMS,
        description="standing rulings (their ids) the enacting answer lifts, with or without a new rule",
    )
    enacts: str | None = Field(
        default=None,
        description="the option that makes `rule` a standing ruling and lifts `revokes` (required with either)",
    )
    statement: Line = Field(
        default="", description="the ruling in words, as the report lists it (default: the question)"
    )

    @field_validator("options")
    @classmethod
    def _options(cls, options: list[str]) -> list[str]:
        bad = [o for o in options if not re.fullmatch(OPTION_PATTERN, o)]
        if bad:
            raise ValueError(
                f"options {bad} are not option names (lower case, digits, '-' or '_', e.g. approve, keep-f16)"
            )
        repeated = sorted({o for o in options if options.count(o) > 1})
        if repeated:
            raise ValueError(f"options are repeated: {repeated}")
        return options

    @field_validator("deciders")
    @classmethod
    def _deciders(cls, people: list[str]) -> list[str]:
        bad = [p for p in people if not re.fullmatch(PERSON_PATTERN, p)]
        if bad:
            raise ValueError(f"deciders {bad} are not person names (lower case, e.g. wayne)")
        return people

    @field_validator("deadline")
    @classmethod
    def _aware(cls, deadline: datetime) -> datetime:
        if deadline.tzinfo is None:
            raise ValueError(
                f"deadline {deadline.isoformat()} has no timezone; write it as e.g. 2026-07-19T17:00:00Z"
            )
        return deadline.astimezone(UTC)

    @model_validator(mode="after")
    def _consistent(self) -> QuestionSpec:
        if self.on_deadline is not None and self.on_deadline not in self.options:
            raise ValueError(f"on_deadline {self.on_deadline!r} is not one of the options {self.options}")
        if (self.rule is None and not self.revokes) != (self.enacts is None):
            raise ValueError(
                "rule and enacts go together: a rule (or revokes) needs the option that enacts it (enacts: "
                "approve), and enacts needs a rule or rulings to revoke"
            )
        if self.enacts is not None:
            if self.enacts not in self.options:
                raise ValueError(f"enacts {self.enacts!r} is not one of the options {self.options}")
            if self.on_deadline == self.enacts:
                raise ValueError(
                    f"on_deadline {self.on_deadline!r} would enact the rule without anyone ruling; a ruling "
                    f"needs a person: choose another on_deadline, or none"
                )
        return self

    def require_open_window(self, now: datetime) -> None:
        """The deadline is ahead, within `QUESTION_DEADLINE_MAX` (checked when filed, not on replay)."""
        if self.deadline < now + QUESTION_DEADLINE_MIN:
            raise ValueError(
                f"deadline {self.deadline:%Y-%m-%d %H:%M:%S} UTC has passed (now {now:%Y-%m-%d %H:%M:%S} UTC); "
                f"give a deadline in the future"
            )
        if self.deadline > now + QUESTION_DEADLINE_MAX:
            raise ValueError(
                f"deadline {self.deadline:%Y-%m-%d} is more than {QUESTION_DEADLINE_MAX.days} days away; a "
                f"question waits at most that long"
            )


class QuestionInput(Model):
    spec: QuestionSpec
    asked_by: str = Field(pattern=PERSON_PATTERN)
    deciders: list[str] = Field(min_length=1, description="resolved when filed: the spec's, or the policy's")


class QuestionState(StrEnum):
    OPEN = "open"
    ANSWERED = "answered"
    RULED = "ruled"
    """Answered with the option that enacts its rule: a standing ruling."""
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"

    @property
    def is_closed(self) -> bool:
        return self is not QuestionState.OPEN


class QuestionStatus(Model):
    question_id: str
    question: str
    status: QuestionState
    asked_by: str
    deadline: datetime
    pending_decision: DecisionRequest | None = None
    outcome: str | None = Field(default=None, description="the option chosen (or recorded at the deadline)")
    decided_by: str | None = None
    note: str = ""
    ruling: Ruling | None = None


class WithdrawQuestion(SpecModel):
    requested_by: str = Field(pattern=PERSON_PATTERN)
    reason: Note = Field(min_length=1)
