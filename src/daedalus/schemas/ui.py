"""Pure helpers for what the Temporal UI shows of a ticket: who it waits for as a KeywordList, the closed
outcome in words, and short summaries for the workflow list and the timeline. Safe inside workflows.

They are the pieces the ticket workflow needs for the search attributes `DaedalusAwaiting` (KeywordList, so
`DaedalusAwaiting = "wayne"` matches a ticket waiting for "wayne" and "lead"), `DaedalusOutcome`, and for
`workflow.set_current_details` / activity `summary=` (Temporal UI 2.x shows both).
"""

from __future__ import annotations

from daedalus.schemas.ticket import TicketSpec, TicketStatus

SUMMARY_LIMIT = 200  # Temporal truncates long summaries in the list; keep them readable there

OUTCOMES: dict[TicketStatus, str] = {
    TicketStatus.PASSED: "passed",
    TicketStatus.FAILED: "failed",
    TicketStatus.CANCELLED: "cancelled",
    TicketStatus.CLOSED_UNDER_EXCEPTION: "closed under exception",
    TicketStatus.STOPPED_BY_RULES: "stopped by the rules",
}
MARKS: dict[TicketStatus, str] = {
    TicketStatus.PASSED: "✅",
    TicketStatus.CLOSED_UNDER_EXCEPTION: "☑️",
    TicketStatus.FAILED: "❌",
    TicketStatus.STOPPED_BY_RULES: "⛔",
    TicketStatus.CANCELLED: "🚫",
}


def awaiting_people(awaiting: str | list[str] | None) -> list[str]:
    """ "wayne,lead" (today's Keyword) -> ["wayne", "lead"]: one KeywordList entry per person, no duplicates."""
    if awaiting is None:
        return []
    parts = awaiting.split(",") if isinstance(awaiting, str) else awaiting
    people: list[str] = []
    for part in parts:
        person = part.strip().lower()
        if person and person not in people:
            people.append(person)
    return people


def outcome_label(status: TicketStatus | str) -> str | None:
    """The closed outcome in words (None while the ticket is open): what a closed ticket's row should say,
    since Temporal shows every one of them as COMPLETED."""
    try:
        return OUTCOMES.get(TicketStatus(status))
    except ValueError:
        return None


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SUMMARY_LIMIT else text[: SUMMARY_LIMIT - 1] + "…"


def ticket_summary(
    ticket_id: str, title: str, status: TicketStatus | str, awaiting: str | list[str] | None
) -> str:
    """One line for the workflow list: "✅ 4 MTP align tax fix — passed", "6e ... — awaiting decision: wayne"."""
    state = TicketStatus(status)
    outcome = outcome_label(state)
    if outcome is not None:
        return _clip(f"{MARKS[state]} {ticket_id} {title} — {outcome}")
    people = awaiting_people(awaiting)
    waiting = f": {', '.join(people)}" if people else ""
    return _clip(f"{ticket_id} {title} — {state.value.replace('_', ' ')}{waiting}")


def current_details(
    status: TicketStatus | str,
    *,
    awaiting: str | list[str] | None = None,
    gate: str | None = None,
    attempt: int | None = None,
    reason: str = "",
) -> str:
    """Markdown for `workflow.set_current_details`: the outcome first when closed, else what happens now."""
    state = TicketStatus(status)
    outcome = outcome_label(state)
    if outcome is not None:
        return f"**{MARKS[state]} {outcome}**" + (f"\n\n{reason}" if reason else "")
    lines = [f"**{state.value.replace('_', ' ')}**"]
    if attempt:
        lines.append(f"attempt {attempt}")
    if gate:
        lines.append(f"measuring gate `{gate}`")
    people = awaiting_people(awaiting)
    if people:
        lines.append(f"waiting for {', '.join(people)}")
    return "\n\n".join(lines)


def gate_activity_summary(gate: str, rule: str, *, attempt: int, round: int = 1) -> str:
    """The timeline bar's label for a gate activity: which gate, its rule, which attempt and round."""
    return _clip(f"gate {gate}: {rule} (attempt {attempt}, round {round})")


def start_summary(spec: TicketSpec) -> str:
    """The workflow's static summary, fixed at start (the list's Summary column): which ticket, on which host."""
    return _clip(f"ticket {spec.id}: {spec.title} ({spec.host})")


def start_details(spec: TicketSpec) -> str:
    """The workflow's static details (Markdown, the top of its page): what the ticket is and what decides it."""
    lines = [f"**{spec.id}** {spec.title}", ""]
    lines.append(f"- host `{spec.host}`; engine `{spec.engine.name if spec.engine else 'none'}`")
    lines.append(
        f"- agent `{spec.agent.name.value if spec.agent else 'none'}`; up to {spec.max_attempts} attempts"
    )
    if spec.parent:
        lines.append(f"- sub-ticket of {spec.parent}")
    if spec.children:
        lines.append(f"- sub-tickets: {', '.join(child.id for child in spec.children)}")
    lines += [f"- gate `{gate.name}`: {gate.describe()}" for gate in spec.gates]
    return "\n".join(lines)
