"""The progress report is rolled up from the store: real tickets run through the workflow, then reported."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.report import build_report, render_html, render_markdown
from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord
from daedalus.store.database import session_scope
from daedalus.store.records import apply
from tests.support import (
    TEST_AUDIT_KEY,
    make_engine_repo,
    running_workers,
    start_ticket,
    ticket_spec,
    wait_for,
)


def death(seq: int, summary: str) -> AuditRecord:
    return AuditRecord(
        event=AuditEvent(
            workflow_id="training-drafter",
            run_id="run-1",
            seq=seq,
            ticket_id="training-drafter",
            kind=AuditKind.DEATH,
            actor="watchdog",
            at=datetime.now(UTC),
            status="restarting",
            summary=summary,
        )
    )


async def test_report_shows_cards_gates_training_and_pending_decisions(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"h-{task_queue[-8:]}"
    repo = make_engine_repo(tmp_path / "repo")
    passing = ticket_spec(repo, host, title="MTP align tax")
    waiting = ticket_spec(repo, host, title="TQ workspace", approval={"deciders": ["wayne"]})
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        await (await start_ticket(temporal_client, passing, task_queue)).result()
        handle = await start_ticket(temporal_client, waiting, task_queue)
        await wait_for(handle, lambda s: s.pending_decision is not None)
        await handle.terminate("test over")
    with session_scope(sqlite_engine) as session:
        apply(session=session, record=death(1, "kernel OOM after 2 h"), key=TEST_AUDIT_KEY)
        apply(session=session, record=death(2, "leak 19 GiB/h, died after 3.5 h"), key=TEST_AUDIT_KEY)
    with session_scope(sqlite_engine) as session:
        report = build_report(session=session, since=datetime.now(UTC) - timedelta(hours=1))
        text = render_markdown(report)
        page = render_html(report)
        facts = report.facts()
    assert f"| Ticket {passing.id}: MTP align tax | passed; decode PASS 55.9 tok/s |" in text
    assert f"| Ticket {waiting.id}: TQ workspace | awaiting approval |" in text
    assert "| decode | PASS | - | 55.9 tok/s |" in text and "decode_tps >= 55" in text
    assert "| drafter | restarting | 2 | - | leak 19 GiB/h, died after 3.5 h |" in text
    assert f"**{waiting.id}-dispatch-1** (wayne," in text
    assert page.count('data-kind="intervals"') == 1, "the passing ticket's gate is drawn"
    assert any(f.startswith(f"ticket {passing.id} 'MTP align tax': passed; decode PASS") for f in facts)
    assert "training drafter: restarting, 2 deaths" in facts
