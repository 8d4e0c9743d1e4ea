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

A trail that batches (`batch_writes`, patch `AUDIT_BATCHES`) writes the events recorded with `wait=False` in the
background, in order: the workflow goes on to its next step at once, and the events recorded before the write
starts (a decision and the dispatch it allows, an attempt and its build, a gate and the close) go in one local
activity and one store transaction, each such pair saving the workflow an activation and a local activity. A
plain `record` waits until the store holds it and everything before it: for a caller that answers with the
written state (an update) or must not go on before (the request a decider is about to be asked). `flush` waits
for the same, and a workflow flushes before it returns or continues as new. A trail that does not batch writes
each event alone and waits for it, `wait` or not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import RECORD_AUDIT_EVENT, RECORD_AUDIT_EVENTS
    from daedalus.decisions.schemas import Decision, DecisionRequest
    from daedalus.errors import BrokenInvariant
    from daedalus.schemas.audit import (
        AuditBatch,
        AuditEvent,
        AuditKind,
        AuditRecord,
        TicketSnapshot,
        TrailHead,
        TrailState,
    )
    from daedalus.schemas.gates import GateResult

AUDIT_TIMEOUT = timedelta(seconds=30)
AUDIT_LOCAL_ACTIVITY = "audit-local-activity"
"""Patch: audit events are written by a local activity (histories before it scheduled a remote one per event)."""
AUDIT_BATCHES = "audit-batched-writes"
"""Patch, asked in the run's first activation (patches.py says why there): the trail batches its writes (see the
module's docstring). Runs started before it write each event alone and wait for it."""
AUDIT_HEAD_QUERY = "audit_head"
"""Every workflow with a trail answers it (daedalus.services.audit holds the store against it)."""
V = TypeVar("V")


@dataclass(frozen=True)
class _Queued(Generic[V]):
    """A recorded event, and what the query shows once it is written."""

    record: AuditRecord
    view: V


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
        self._batched = False
        self._local = False
        """Whether the run's patch bundle holds `AUDIT_LOCAL_ACTIVITY` (else it is asked at the first write)."""
        self._queue: list[_Queued[V]] = []
        self._writer: asyncio.Task[None] | None = None
        workflow.set_query_handler(AUDIT_HEAD_QUERY, self.head)

    def head(self) -> TrailHead:
        """How far the store holds this trail (a query, so it never changes the workflow's history)."""
        info = workflow.info()
        return TrailHead(
            subject=self.subject,
            workflow_id=info.workflow_id,
            run_id=info.first_execution_run_id,
            seq=self.written_seq,
        )

    def begin(self) -> None:
        """Take the starting view, once the workflow's parts exist: every event before it is written."""
        self._written_view = self._view(self.seq)

    @property
    def written(self) -> V:
        """The view as of the last event the store holds."""
        if self._written_view is None:
            raise BrokenInvariant("AuditTrail.begin() is called at the end of the workflow's init")
        return self._written_view

    def carry(self) -> TrailState:
        if not self.idle:
            raise BrokenInvariant("a workflow flushes its trail before it continues as new")
        return TrailState(seq=self.seq, status=self.written_status)

    def batch_writes(self, bundled: bool = False) -> None:
        """Ask `AUDIT_BATCHES`: call it in `run`'s first activation, before anything that awaits. `bundled`: the
        run recorded a patch bundle that holds both `AUDIT_BATCHES` and `AUDIT_LOCAL_ACTIVITY` (neither is asked)."""
        self._batched = bundled or workflow.patched(AUDIT_BATCHES)
        self._local = bundled

    @property
    def idle(self) -> bool:
        """Nothing recorded waits to be written."""
        return not self._queue and (self._writer is None or self._writer.done())

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
        wait: bool = True,
    ) -> None:
        """Write one event. `wait`: return once the store holds it and every event before it; False lets a
        batching trail write it in the background, with the events recorded near it. The seq is taken before
        any await, so concurrent handlers never share one."""
        if not self._writes():
            self.written_status, self._written_view = self._status(), self._view(self.seq)
            return
        self._raise_if_failed()
        self.seq += 1
        seq = self.seq
        info = workflow.info()
        status = self._status()
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
        queued = _Queued(record, self._view(seq))
        if not self._batched:
            await self._write([queued])
            return
        self._queue.append(queued)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queued())
        if wait:
            await self.flush()

    async def flush(self) -> None:
        """Wait until the store holds every event recorded so far (at once when nothing waits)."""
        if not self.idle:
            await workflow.wait_condition(lambda: self.idle)
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        """A write that failed for good (its activity's error) fails whoever records or flushes next."""
        failure = self._writer.exception() if self._writer is not None and self._writer.done() else None
        if failure is not None:
            raise failure

    async def _write_queued(self) -> None:
        """The background writer: everything recorded by the time it runs goes in one write."""
        while self._queue:
            batch, self._queue = self._queue, []
            await self._write(batch)

    async def _write(self, batch: list[_Queued[V]]) -> None:
        local = self._local or workflow.patched(AUDIT_LOCAL_ACTIVITY)
        if not self._batched:
            [one] = batch
            write = RECORD_AUDIT_EVENT.execute_local if local else RECORD_AUDIT_EVENT.execute
            await write(one.record, start_to_close_timeout=AUDIT_TIMEOUT)
        else:
            records = AuditBatch(records=[queued.record for queued in batch])
            write_all = RECORD_AUDIT_EVENTS.execute_local if local else RECORD_AUDIT_EVENTS.execute
            await write_all(records, start_to_close_timeout=AUDIT_TIMEOUT)
        for queued in batch:
            self._written(queued.record.event.seq, queued.record.event.status, queued.view)

    def _written(self, seq: int, status: str, view: V) -> None:
        """Advance the written prefix; concurrent handlers may finish their writes out of order."""
        self._out_of_order[seq] = (status, view)
        while self.written_seq + 1 in self._out_of_order:
            self.written_seq += 1
            self.written_status, self._written_view = self._out_of_order.pop(self.written_seq)
