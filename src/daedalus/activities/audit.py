"""The activities that write the audit store (control queue): one event, or a trail's batch of them."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine
from temporalio import activity

from daedalus.activities.refs import RECORD_AUDIT_EVENT, RECORD_AUDIT_EVENTS
from daedalus.errors import maps_errors
from daedalus.schemas.audit import AuditBatch, AuditRecord
from daedalus.store.database import session_scope
from daedalus.store.records import apply, apply_all


class AuditActivities:
    def __init__(self, engine: Engine):
        self.engine = engine
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
        return await asyncio.get_running_loop().run_in_executor(self._writer, self._write, record)

    def _write(self, record: AuditRecord) -> bool:
        with session_scope(self.engine) as session:
            return apply(session=session, record=record)

    @activity.defn(name=RECORD_AUDIT_EVENTS.name)
    @maps_errors
    async def record_audit_events(self, batch: AuditBatch) -> int:
        """Write a batch of consecutive events in one transaction; how many were new (0 for a retry)."""
        return await asyncio.get_running_loop().run_in_executor(self._writer, self._write_all, batch)

    def _write_all(self, batch: AuditBatch) -> int:
        with session_scope(self.engine) as session:
            return apply_all(session=session, records=batch.records)
