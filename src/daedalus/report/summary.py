"""The digest's few lines for Slack: counts and what waits, with a link to the full report. No new facts."""

from __future__ import annotations

from collections import Counter

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
    for request in report.pending[:MAX_WAITING_LINES]:
        lines.append(f"• {request.request_id} ({', '.join(request.deciders)}): {request.question}")
    if len(report.pending) > MAX_WAITING_LINES:
        lines.append(f"• and {len(report.pending) - MAX_WAITING_LINES} more")
    if report.lessons:
        lines.append(f"Lessons recorded: {len(report.lessons)}")
    if link:
        lines.append(f"<{link}|Full report>")
    return "\n".join(lines)
