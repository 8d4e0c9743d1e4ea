"""`post_report_digest` (control queue): write the HTML report to the artifact store and post a short summary
with a link to Slack, naming the tickets stuck on a host no worker polls. Run by the report schedule; a retry
finds its first post and does not post again."""

from __future__ import annotations

import asyncio
import os
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog
from slack_sdk.errors import SlackApiError
from sqlalchemy import Engine
from temporalio import activity
from temporalio.service import RPCError

from daedalus.activities.refs import POST_REPORT_DIGEST
from daedalus.errors import RegistryError
from daedalus.hosts.registry import load_registry
from daedalus.hosts.status import ON_A_HOST, waiting_on_hosts
from daedalus.report import build_report, render_html
from daedalus.report.summary import summary_text
from daedalus.schemas.notify import NotifyOutcome, NotifyResult
from daedalus.schemas.report import DigestInput, DigestResult
from daedalus.slack.ledger import PostedLedger
from daedalus.slack.notifier import SlackNotifier
from daedalus.slack.settings import SlackSettings
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.store.tables import TicketRow

TRANSIENT_ATTEMPTS = 3
log = structlog.get_logger(__name__)


class ReportActivities:
    def __init__(self, engine: Engine, slack: SlackSettings, artifacts: Path, hosts_file: Path | None = None):
        self.engine = engine
        self.slack = slack
        self.hosts_file = hosts_file
        """The host registry: with it, the digest names each ticket whose step waits on a host no worker polls."""
        self.reports = artifacts / "reports"
        self.ledger = PostedLedger(artifacts / "slack-posted" / "digests")

    @activity.defn(name=POST_REPORT_DIGEST.name)
    async def post_report_digest(self, request: DigestInput) -> DigestResult:
        info = activity.info()
        waiting = await self._waiting_on_hosts()
        return await asyncio.to_thread(self._digest, request, info.workflow_id or info.activity_id, waiting)

    async def _waiting_on_hosts(self) -> dict[str, str]:
        """ticket id -> "queued for host-mavis since 22:03 UTC; no worker polls it; ..." for every ticket the store
        shows on a host nobody serves, however long ago it got there. Empty without a registry, or when it or
        Temporal cannot be read: the digest still posts the rest, and the worker's log says why."""
        if self.hosts_file is None:
            return {}

        def on_a_host() -> list[TicketRow]:
            with session_scope(self.engine) as session:
                return [
                    row
                    for status in sorted(ON_A_HOST)
                    for row in queries.list_tickets(session=session, status=status.value, limit=1000)
                ]

        try:
            tickets = await asyncio.to_thread(on_a_host)
            if not tickets:
                return {}
            client = activity.client()
            return await waiting_on_hosts(client, load_registry(self.hosts_file), tickets, client.namespace)
        except (RegistryError, RPCError) as error:
            log.warning("digest_without_host_lines", error=str(error))
            return {}

    def _digest(self, request: DigestInput, key: str, waiting: dict[str, str]) -> DigestResult:
        now = datetime.now(UTC)
        since = now - timedelta(hours=request.window_hours)
        with session_scope(self.engine) as session:
            report = build_report(session=session, since=since, now=now, waiting_on_hosts=waiting)
        html_path = self._write(render_html(report), key)
        text = summary_text(report, request.link)
        return DigestResult(summary=text, html_path=str(html_path), notify=self._post(text, key))

    def _write(self, page: str, key: str) -> Path:
        """The digest's own page, and `latest.html` beside it; each replaced atomically."""
        self.reports.mkdir(parents=True, exist_ok=True)
        target = self.reports / f"{key.replace('/', '_')}.html"
        for path in (target, self.reports / "latest.html"):
            fd, temporary = tempfile.mkstemp(dir=self.reports, prefix=".writing-")
            with os.fdopen(fd, "w") as handle:
                handle.write(page)
            os.replace(temporary, path)
        return target

    def _post(self, text: str, key: str) -> NotifyResult:
        settings = self.slack
        if settings.bot_token is None or not settings.channel:
            return NotifyResult(
                outcome=NotifyOutcome.NOT_CONFIGURED,
                detail="Slack is not configured (set DAEDALUS_SLACK_BOT_TOKEN and DAEDALUS_SLACK_CHANNEL)",
            )
        done = self.ledger.get(key, 0)
        if done is not None:
            return NotifyResult(outcome=NotifyOutcome.ALREADY_POSTED, channel=done.channel, ts=done.ts)
        notifier = SlackNotifier(
            token=settings.bot_token.get_secret_value(), channel=settings.channel, base_url=settings.base_url
        )
        try:
            posted = notifier.post_text(text)
        except (SlackApiError, OSError) as error:
            if activity.in_activity() and activity.info().attempt < TRANSIENT_ATTEMPTS:
                raise
            reason = str(error.response.get("error", "")) if isinstance(error, SlackApiError) else str(error)
            return NotifyResult(
                outcome=NotifyOutcome.FAILED,
                channel=settings.channel,
                detail=f"Slack refused the report digest: {reason}",
            )
        self.ledger.put(key, 0, posted)
        return NotifyResult(outcome=NotifyOutcome.POSTED, channel=posted.channel, ts=posted.ts)
