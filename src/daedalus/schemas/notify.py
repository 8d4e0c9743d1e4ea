"""What a decision notification (Slack) did. Pydantic only, so the workflow may read it."""

from enum import StrEnum

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
