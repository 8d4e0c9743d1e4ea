"""The activities that write the audit store (control queue): one event, or a trail's batch of them."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import structlog
from sqlalchemy import Engine
from temporalio import activity
from temporalio.service import RPCError

from daedalus.activities.refs import RECORD_AUDIT_EVENT, RECORD_AUDIT_EVENTS
from daedalus.errors import maps_errors
from daedalus.schemas.audit import CANCEL_CLIENT, CANCEL_REASON, CANCELLED_THROUGH, AuditBatch, AuditRecord
from daedalus.store.database import session_scope
from daedalus.store.records import apply, apply_all
from daedalus.store.seals import AuditKey

log = structlog.get_logger(__name__)


class AuditActivities:
    def __init__(self, engine: Engine, key: AuditKey):
        self.engine = engine
        self.key = key
        # SQLite takes one writer at a time, and a writer that finds the file locked sleeps in SQLite's busy
        # handler (1, 2, 5 ... 100 ms steps) however soon the lock frees: in a burst of decisions that sleep,
        # not the write, was most of a decide's time. One writer thread per worker queues the writes instead
        # (each starts the moment the one before commits). PostgreSQL locks rows and takes them concurrently.
        self._writer = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-writer")
            if engine.dialect.name == "sqlite"
            else None
        )

    @activity.defn(name=RECORD_AUDIT_EVENT.name)
    @maps_errors
    async def record_audit_event(self, record: AuditRecord) -> bool:
        """Write one transition; a retry of an already written event writes nothing and returns False."""
        record = await cancellation_source(record)
        return await asyncio.get_running_loop().run_in_executor(self._writer, self._write, record)

    def _write(self, record: AuditRecord) -> bool:
        with session_scope(self.engine) as session:
            return apply(session=session, record=record, key=self.key)

    @activity.defn(name=RECORD_AUDIT_EVENTS.name)
    @maps_errors
    async def record_audit_events(self, batch: AuditBatch) -> int:
        """Write a batch of consecutive events in one transaction; how many were new (0 for a retry)."""
        batch = AuditBatch(records=[await cancellation_source(record) for record in batch.records])
        return await asyncio.get_running_loop().run_in_executor(self._writer, self._write_all, batch)

    def _write_all(self, batch: AuditBatch) -> int:
        with session_scope(self.engine) as session:
            return apply_all(session=session, records=batch.records, key=self.key)


async def cancellation_source(record: AuditRecord) -> AuditRecord:
    """A close caused by a cancellation sent to Temporal (not through Daedalus) says who sent it and why, as
    the workflow's history recorded them (the client's identity and the request's reason): the workflow
    itself cannot see them."""
    event = record.event
    if event.detail.get(CANCELLED_THROUGH) != "temporal" or CANCEL_CLIENT in event.detail:
        return record
    client, reason = "unknown", ""
    try:
        async for found in activity.client().get_workflow_handle(event.workflow_id).fetch_history_events():
            if found.HasField("workflow_execution_cancel_requested_event_attributes"):
                requested = found.workflow_execution_cancel_requested_event_attributes
                client, reason = requested.identity or "unknown", requested.cause
    except RPCError as error:
        log.warning("cancellation_source_unread", workflow_id=event.workflow_id, error=str(error))
    said = f"with the reason {reason!r}" if reason else "with no reason"
    summary = f"{event.summary}: requested by the Temporal client {client!r} {said}"
    detail = {**event.detail, CANCEL_CLIENT: client, CANCEL_REASON: reason}
    return record.model_copy(
        update={"event": event.model_copy(update={"summary": summary, "detail": detail})}
    )
