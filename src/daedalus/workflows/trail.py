"""The audit trail of one workflow: it owns the sequence number and writes each transition as one event.

Every workflow (ticket, training run, the ones to come) writes through an `AuditTrail`: `record_audit_event`
is idempotent on (first run id, seq), the seq travels across continue-as-new in `TrailState`, and the trail
knows which prefix of its events the store holds, so a status query never reports a state whose event is
still being written (a reader would otherwise see a closed ticket whose closing event is not in the store yet).

Events are written by a local activity: the control worker that runs the workflow writes the store itself,
inside the workflow task that made the event, and the history keeps one marker per event (with its result)
instead of an activity's scheduled/started/completed events and the workflow task that each completion
wakes. A decision that sets a ticket going thus costs a few workflow tasks instead of one per event, and a
ticket's history in the UI is its steps, not mostly `record_audit_event`. Replay is safe: a replay reads each
write's result from its marker and runs nothing; a write whose marker never reached the history (the worker
died inside the task) runs again when the task is retried, and the store's idempotence on (run id, seq) makes
that a no-op. Histories from before (one remote activity per event) keep their remote activities: the
`AUDIT_LOCAL_ACTIVITY` patch is absent from them, so `workflow.patched` is False for the rest of such a run.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Generic, TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import RECORD_AUDIT_EVENT
    from daedalus.decisions.schemas import Decision, DecisionRequest
    from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord, TicketSnapshot, TrailState
    from daedalus.schemas.gates import GateResult

AUDIT_TIMEOUT = timedelta(seconds=30)
AUDIT_LOCAL_ACTIVITY = "audit-local-activity"
"""Patch: audit events are written by a local activity (histories before it scheduled a remote one per event)."""
V = TypeVar("V")


class AuditTrail(Generic[V]):
    """Writes events for `subject` (a ticket id, or `training-<name>`) and tracks the written prefix: `view`
    is what the workflow's query shows as of a seq, and `written` is that view as of the last written event."""

    def __init__(
        self,
        subject: str,
        *,
        status: Callable[[], str],
        view: Callable[[int], V],
        snapshot: Callable[[int, AuditKind], TicketSnapshot | None] = lambda seq, kind: None,
        carried: TrailState | None = None,
        writes: Callable[[], bool] = lambda: True,
    ) -> None:
        """`writes` False: this run writes no events (a history recorded before it did); reads follow the state."""
        self.subject = subject
        self._writes = writes
        self._status = status
        self._snapshot = snapshot
        carried = carried or TrailState(status=status())
        self.seq = carried.seq
        self.written_seq = carried.seq
        self.written_status = carried.status
        self._view = view
        self._written_view: V | None = None
        self._out_of_order: dict[int, tuple[str, V]] = {}

    def begin(self) -> None:
        """Take the starting view, once the workflow's parts exist: every event before it is written."""
        self._written_view = self._view(self.seq)

    @property
    def written(self) -> V:
        """The view as of the last event the store holds."""
        assert self._written_view is not None, (
            "AuditTrail.begin() is called at the end of the workflow's init"
        )
        return self._written_view

    def carry(self) -> TrailState:
        return TrailState(seq=self.seq, status=self.written_status)

    async def record(
        self,
        kind: AuditKind,
        summary: str,
        *,
        actor: str = "daedalus",
        detail: dict[str, str] | None = None,
        decision_request: DecisionRequest | None = None,
        decision: Decision | None = None,
        gate_results: list[GateResult] | None = None,
        attempt: int = 0,
    ) -> None:
        """Write one event. The seq is taken before the await, so concurrent handlers never share one."""
        if not self._writes():
            self.written_status, self._written_view = self._status(), self._view(self.seq)
            return
        self.seq += 1
        seq = self.seq
        info = workflow.info()
        status = self._status()
        view = self._view(seq)
        record = AuditRecord(
            event=AuditEvent(
                workflow_id=info.workflow_id,
                run_id=info.first_execution_run_id,
                seq=seq,
                ticket_id=self.subject,
                kind=kind,
                actor=actor.lower(),
                at=workflow.now(),
                status=status,
                summary=summary,
                detail=detail or {},
            ),
            ticket=self._snapshot(seq, kind),
            decision_request=decision_request,
            decision=decision,
            attempt=attempt,
            gate_results=gate_results or [],
        )
        if workflow.patched(AUDIT_LOCAL_ACTIVITY):
            await RECORD_AUDIT_EVENT.execute_local(record, start_to_close_timeout=AUDIT_TIMEOUT)
        else:
            await RECORD_AUDIT_EVENT.execute(record, start_to_close_timeout=AUDIT_TIMEOUT)
        self._written(seq, status, view)

    def _written(self, seq: int, status: str, view: V) -> None:
        """Advance the written prefix; concurrent handlers may finish their writes out of order."""
        self._out_of_order[seq] = (status, view)
        while self.written_seq + 1 in self._out_of_order:
            self.written_seq += 1
            self.written_status, self._written_view = self._out_of_order.pop(self.written_seq)
