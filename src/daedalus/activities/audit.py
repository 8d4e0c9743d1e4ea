"""The one activity that writes the audit store (control queue)."""

import asyncio

from sqlalchemy import Engine
from temporalio import activity

from daedalus.activities.refs import RECORD_AUDIT_EVENT
from daedalus.errors import maps_errors
from daedalus.schemas.audit import AuditRecord
from daedalus.store.database import session_scope
from daedalus.store.records import apply


class AuditActivities:
    def __init__(self, engine: Engine):
        self.engine = engine

    @activity.defn(name=RECORD_AUDIT_EVENT.name)
    @maps_errors
    async def record_audit_event(self, record: AuditRecord) -> bool:
        """Write one transition; a retry of an already written event writes nothing and returns False."""
        return await asyncio.to_thread(self._write, record)

    def _write(self, record: AuditRecord) -> bool:
        with session_scope(self.engine) as session:
            return apply(session=session, record=record)
