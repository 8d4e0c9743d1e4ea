"""A waiting decision reaches Slack from the running workflow: the request, then reminders in its thread."""

from pathlib import Path

from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.schemas.ticket import Decision, TicketStatus
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.ticket import TicketWorkflow
from tests.slack.fake_slack import running_fake_slack
from tests.slack.test_notify import settings_for
from tests.support import make_engine_repo, running_workers, start_ticket, ticket_spec, wait_for


async def test_decision_request_and_reminders_are_posted_once_each(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"h-{task_queue[-8:]}"
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"),
        host,
        approval={"deciders": ["wayne"], "reminder_interval_s": 1},
    )
    with running_fake_slack() as slack:
        async with running_workers(
            temporal_client, sqlite_engine, tmp_path, task_queue, host, slack=settings_for(slack)
        ):
            handle = await start_ticket(temporal_client, spec, task_queue)
            state = await wait_for(
                handle, lambda s: s.pending_decision is not None and s.pending_decision.reminders_sent >= 2
            )
            request = state.pending_decision
            assert request is not None
            await handle.execute_update(
                TicketWorkflow.decide, Decision(request_id=request.id, option="approve", decided_by="wayne")
            )
            final = await handle.result()
    assert final.status is TicketStatus.PASSED
    first, *reminders = slack.posts
    assert request.id in str(first) and "approve" in str(first)
    assert len(reminders) >= 2 and all(post.get("thread_ts") == first["ts"] for post in reminders)
    # Exactly one post per request and per reminder the audit trail records.
    with session_scope(sqlite_engine) as session:
        events = queries.audit_events(session=session, ticket_id=spec.id)
    assert len(reminders) == sum(1 for e in events if e.kind == "decision_reminder")
