"""Values the Slack adapter passes around. Pydantic only, so a workflow may import them."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from daedalus.schemas._base import Model


class NotifyOutcome(StrEnum):
    POSTED = "posted"
    ALREADY_POSTED = "already_posted"
    NOT_CONFIGURED = "not_configured"
    FAILED = "failed"


class NotifyResult(Model):
    """What `notify_decision_request` did. It never raises for a permanent Slack problem: it says so here."""

    outcome: NotifyOutcome
    channel: str | None = None
    ts: str | None = None
    detail: str = ""


class PostedMessage(Model):
    channel: str
    ts: str


class ButtonValue(Model):
    """The `value` of a decision button: which request, which option."""

    request_id: str = Field(min_length=1)
    option: str = Field(min_length=1)
