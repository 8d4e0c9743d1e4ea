"""Post decision requests to Slack with `slack_sdk.WebClient`; answer button clicks through their response_url."""

from __future__ import annotations

from slack_sdk import WebClient
from slack_sdk.webhook import WebhookClient

from daedalus.schemas.ticket import DecisionRequest
from daedalus.slack.blocks import decision_blocks, fallback_text
from daedalus.slack.models import PostedMessage
from daedalus.slack.settings import SLACK_API


class SlackNotifier:
    """One bot token, one channel. Raises `slack_sdk.errors.SlackApiError` when Slack says no."""

    def __init__(self, *, token: str, channel: str, base_url: str = SLACK_API, timeout_s: int = 10):
        self.channel = channel
        self.client = WebClient(token=token, base_url=_with_slash(base_url), timeout=timeout_s)

    def post_decision_request(
        self, request: DecisionRequest, *, thread_ts: str | None = None
    ) -> PostedMessage:
        """Post the question with one button per option; a reminder goes into the first post's thread."""
        response = self.client.chat_postMessage(
            channel=self.channel,
            text=fallback_text(request),
            blocks=decision_blocks(request),
            thread_ts=thread_ts,
            reply_broadcast=thread_ts is not None,
            unfurl_links=False,
        )
        return PostedMessage(channel=str(response["channel"]), ts=str(response["ts"]))

    def post_text(self, text: str) -> PostedMessage:
        """Post plain mrkdwn text (the report digest)."""
        response = self.client.chat_postMessage(channel=self.channel, text=text, unfurl_links=False)
        return PostedMessage(channel=str(response["channel"]), ts=str(response["ts"]))


def answer_interaction(response_url: str, text: str, *, replace_original: bool, timeout_s: int = 10) -> int:
    """Answer a click: replace the message (decided) or tell only the clicker (refused). Returns the HTTP status."""
    client = WebhookClient(response_url, timeout=timeout_s)
    if replace_original:
        response = client.send(text=text, replace_original=True)
    else:
        response = client.send(text=text, response_type="ephemeral", replace_original=False)
    return response.status_code


def _with_slash(url: str) -> str:
    return url if url.endswith("/") else url + "/"
