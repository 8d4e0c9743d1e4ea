"""`notify_decision_request` (control queue): post a DecisionRequest to Slack, once per request and reminder.

It never fails a ticket: without a bot token it says `not_configured`; a permanent Slack refusal (bad token,
unknown channel) comes back as `failed` with Slack's reason; a transient one (network, rate limit, 5xx) is
raised as `SlackUnavailable`, which Temporal retries, and after `TRANSIENT_ATTEMPTS` it too comes back as `failed`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from slack_sdk.errors import SlackApiError
from temporalio import activity

from daedalus.activities.refs import NOTIFY_DECISION_REQUEST
from daedalus.decisions.schemas import DecisionRequest
from daedalus.errors import SlackUnavailable, maps_errors
from daedalus.schemas.notify import NotifyOutcome, NotifyResult
from daedalus.slack.ledger import PostedLedger
from daedalus.slack.notifier import SlackNotifier
from daedalus.slack.settings import SlackSettings

TRANSIENT_ATTEMPTS = 3
TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "service_unavailable", "internal_error", "fatal_error", "request_timeout"}
)


class NotifyActivities:
    def __init__(self, settings: SlackSettings, ledger_dir: Path):
        self.settings = settings
        self.ledger = PostedLedger(ledger_dir)

    @activity.defn(name=NOTIFY_DECISION_REQUEST.name)
    @maps_errors
    async def notify_decision_request(self, request: DecisionRequest) -> NotifyResult:
        """Post the request (or its reminder) to the configured channel; a retry finds the first post and stops."""
        return await asyncio.to_thread(self._notify, request)

    def _notify(self, request: DecisionRequest) -> NotifyResult:
        settings = self.settings
        if settings.bot_token is None or not settings.channel:
            return NotifyResult(
                outcome=NotifyOutcome.NOT_CONFIGURED,
                detail="Slack is not configured (set DAEDALUS_SLACK_BOT_TOKEN and DAEDALUS_SLACK_CHANNEL)",
            )
        reminder = request.reminders_sent
        done = self.ledger.get(request.id, reminder)
        if done is not None:
            return NotifyResult(outcome=NotifyOutcome.ALREADY_POSTED, channel=done.channel, ts=done.ts)
        first = self.ledger.get(request.id, 0) if reminder else None
        notifier = SlackNotifier(
            token=settings.bot_token.get_secret_value(), channel=settings.channel, base_url=settings.base_url
        )
        try:
            posted = notifier.post_decision_request(request, thread_ts=first.ts if first else None)
        except SlackApiError as error:
            reason = str(error.response.get("error", "")) or f"HTTP {error.response.status_code}"
            transient = reason in TRANSIENT_ERRORS or error.response.status_code >= 500
            if transient and activity.info().attempt < TRANSIENT_ATTEMPTS:
                raise SlackUnavailable(f"Slack could not take {request.id} yet: {reason}") from error
            return NotifyResult(
                outcome=NotifyOutcome.FAILED,
                channel=settings.channel,
                detail=f"Slack refused to post {request.id} to {settings.channel}: {reason}",
            )
        except OSError as error:  # network: URLError, timeouts, refused connections
            if activity.info().attempt < TRANSIENT_ATTEMPTS:
                raise SlackUnavailable(f"cannot reach Slack at {settings.base_url}: {error}") from error
            return NotifyResult(
                outcome=NotifyOutcome.FAILED,
                channel=settings.channel,
                detail=f"cannot reach Slack at {settings.base_url}: {error}",
            )
        self.ledger.put(request.id, reminder, posted)
        activity.logger.info(
            "posted decision request %s to %s (ts %s)", request.id, posted.channel, posted.ts
        )
        return NotifyResult(outcome=NotifyOutcome.POSTED, channel=posted.channel, ts=posted.ts)
