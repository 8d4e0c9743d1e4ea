"""The digest's few lines for Slack: counts and what waits, with a link to the full report. No new facts.

Everything taken from the store (questions, ids, host lines) is escaped for Slack: a question holding
`<!channel>` must not notify a channel, nor a `<url|label>` disguise a link."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from daedalus.escaping import for_slack
from daedalus.report.model import Report

MAX_WAITING_LINES = 5


def summary_text(report: Report, link: str = "") -> str:
    tickets = report.all_tickets()
    statuses = Counter(t.row.status for t in tickets)
    by_status = ", ".join(f"{n} {status.replace('_', ' ')}" for status, n in sorted(statuses.items()))
    deaths = sum(len(run.deaths) for run in report.training)
    lines = [
        f"*Progress report since {report.since:%Y-%m-%d %H:%M} UTC*",
        f"Tickets: {len(tickets)}" + (f" ({by_status})" if by_status else ""),
    ]
    if report.campaigns:
        crashed = sum(len(c.crashed) for c in report.campaigns)
        lines.append(f"Campaigns: {len(report.campaigns)}, {crashed} crashed cells")
    if report.training:
        lines.append(f"Training runs: {len(report.training)}, {deaths} deaths")
    lines.append(f"Decisions waiting: {len(report.pending)}; decided in the window: {len(report.decided)}")
    lines += bullets(
        for_slack(f"{r.request_id} ({', '.join(r.deciders)}): {r.question}") for r in report.pending
    )
    if report.waiting_on_hosts:
        lines.append(f"Waiting on a host no worker polls: {len(report.waiting_on_hosts)}")
        lines += bullets(
            for_slack(f"{ticket}: {line}") for ticket, line in sorted(report.waiting_on_hosts.items())
        )
    if report.lessons:
        lines.append(f"Lessons recorded: {len(report.lessons)}")
    if link:
        lines.append(f"<{link}|Full report>")
    return "\n".join(lines)


def bullets(items: Iterable[str]) -> list[str]:
    """The first MAX_WAITING_LINES items as bullets, and how many more there are."""
    shown = list(items)
    more = len(shown) - MAX_WAITING_LINES
    return [f"• {item}" for item in shown[:MAX_WAITING_LINES]] + ([f"• and {more} more"] if more > 0 else [])
