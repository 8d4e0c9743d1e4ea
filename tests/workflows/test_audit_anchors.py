"""`daedalus audit verify` holds the store to Temporal: every workflow answers how far its trail got, so a trail
cut short or deleted whole by a database writer shows, though its hash chain and seals are intact."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.schemas.audit import TrailHead
from daedalus.schemas.ticket import TicketStatus
from daedalus.services.audit import verify
from daedalus.store.chain import BreakKind
from daedalus.workflows.trail import AUDIT_HEAD_QUERY
from tests.store.test_chain import sql
from tests.support import TEST_AUDIT_KEY, make_engine_repo, running_workers, start_ticket, ticket_spec


async def test_a_truncated_or_deleted_trail_is_named_against_its_workflow(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"h-{task_queue[-8:]}"
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await start_ticket(temporal_client, spec, task_queue)
        state = await handle.result()
        assert state.status is TicketStatus.PASSED
        head = await handle.query(AUDIT_HEAD_QUERY, result_type=TrailHead)
        assert (head.subject, head.seq) == (spec.id, state.audit_seq)
        intact = await verify(sqlite_engine, TEST_AUDIT_KEY, temporal_client, [spec.id])
        assert intact.breaks == [] and intact.anchored == 1 and intact.unanchored == []
        # The closing event deleted, and the projection moved back to hide it: chain and seals still verify.
        sql(
            sqlite_engine, "DELETE FROM audit_events WHERE ticket_id = :t AND seq = :s", t=spec.id, s=head.seq
        )
        sql(sqlite_engine, "UPDATE tickets SET last_seq = :s WHERE ticket_id = :t", t=spec.id, s=head.seq - 1)
        [cut] = (await verify(sqlite_engine, TEST_AUDIT_KEY, temporal_client, [spec.id])).breaks
        assert cut.kind is BreakKind.TRUNCATED and f"up to #{head.seq}" in cut.message, cut.message
        for table in ("audit_events", "tickets", "decisions", "verdicts"):
            sql(sqlite_engine, f"DELETE FROM {table} WHERE ticket_id = :t", t=spec.id)
        [gone] = (await verify(sqlite_engine, TEST_AUDIT_KEY, temporal_client, [spec.id])).breaks
        assert gone.kind is BreakKind.TRUNCATED and "every event of it was deleted" in gone.message
