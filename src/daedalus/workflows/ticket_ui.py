"""What the Temporal UI shows of a running ticket: its search attributes and its current details.

The list filters on `DaedalusStatus`, `DaedalusWaitingFor` (one entry per person who may answer) and
`DaedalusOutcome`; the workflow's page opens with its current details (Markdown): the title, then the outcome
once closed, else the status, the attempt, the gate being measured and who the ticket waits for. Neither
current details nor an activity's summary is a command, so both are free for histories recorded before them;
the search attributes ride on the upserts the ticket made before (see `SearchAttributesMirror`).
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from daedalus.schemas import search_attributes as sa
    from daedalus.schemas.ticket import TicketSpec, TicketStatus
    from daedalus.schemas.ui import awaiting_people, current_details, outcome_label
    from daedalus.workflows.steps import SearchAttributesMirror


class TicketUi:
    def __init__(self) -> None:
        self.mirror = SearchAttributesMirror()
        self._status = TicketStatus.DRAFT
        self._waiting_for: list[str] = []
        self._latest = ""

    def identity(self, spec: TicketSpec) -> None:
        """The attributes fixed for the ticket's life (a no-op when the starter, or the last run, set them)."""
        self.mirror.publish(sa.ticket_identity(spec))

    def show(
        self, spec: TicketSpec, status: TicketStatus, latest: str, *, waiting_for: Sequence[str] = ()
    ) -> None:
        """A new status: `latest` says what just happened (a closed ticket's: why it closed)."""
        self._status, self._latest = status, latest
        self._waiting_for = awaiting_people(list(waiting_for))
        self.mirror.publish(
            {
                sa.STATUS: status.value,
                sa.WAITING_FOR: self._waiting_for,
                sa.OUTCOME: outcome_label(status),
                sa.LEGACY_AWAITING: None,
            }
        )
        self._details(spec)

    def measuring(self, spec: TicketSpec, gate: str, attempt: int) -> None:
        """The gate being measured, until the next status (the timeline's bar names its round)."""
        self._details(spec, gate=gate, attempt=attempt)

    def _details(self, spec: TicketSpec, *, gate: str | None = None, attempt: int | None = None) -> None:
        closed = self._status.is_closed
        state = current_details(
            self._status,
            awaiting=self._waiting_for,
            gate=gate,
            attempt=attempt,
            reason=self._latest if closed else "",
        )
        latest = "" if closed or not self._latest else f"\n\n{self._latest}"
        workflow.set_current_details(f"### {spec.id}: {spec.title}\n\n{state}{latest}")
