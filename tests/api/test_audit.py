"""GET /audit filters (ticket, actor, since) over the real store, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import httpx
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.api import create_app
from daedalus.api.settings import ApiSettings
from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord
from daedalus.slack.settings import SlackSettings
from daedalus.store.database import session_scope
from daedalus.store.records import apply
from tests.api.conftest import as_, install_tokens
from tests.support import TEST_AUDIT_KEY

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


def event(ticket: str, run: str, seq: int, kind: AuditKind, actor: str, at: datetime) -> AuditRecord:
    return AuditRecord(
        event=AuditEvent(
            workflow_id=f"ticket-{ticket}",
            run_id=run,
            seq=seq,
            ticket_id=ticket,
            kind=kind,
            actor=actor,
            at=at,
            status="awaiting_approval",
            summary=f"{kind.value} by {actor}",
        )
    )


async def test_audit_filters_by_ticket_actor_and_time(temporal_client: Client, store_engine: Engine) -> None:
    a, b = f"a{uuid.uuid4().hex[:6]}", f"b{uuid.uuid4().hex[:6]}"
    records = [
        event(a, f"run-{a}", 1, AuditKind.FILED, "wayne", T0),
        event(a, f"run-{a}", 2, AuditKind.DECIDED, "wayne", T0 + timedelta(hours=1)),
        event(b, f"run-{b}", 1, AuditKind.FILED, "mallory", T0 + timedelta(hours=2)),
    ]
    with session_scope(store_engine) as session:
        assert all(apply(session=session, record=r, key=TEST_AUDIT_KEY) for r in records)
    install_tokens(store_engine)
    app = create_app(
        client=temporal_client,
        engine=store_engine,
        control_queue="unused",
        settings=ApiSettings(),
        slack=SlackSettings(),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://daedalus") as api:

        async def audit(**params: str) -> list[tuple[str, int, str]]:
            answer = await api.get("/audit", params=params, headers=as_("wayne"))
            assert answer.status_code == 200, answer.text
            return [(e["ticket_id"], e["seq"], e["actor"]) for e in answer.json()]

        assert await audit(ticket=a) == [(a, 1, "wayne"), (a, 2, "wayne")]
        assert await audit(actor="mallory") == [(b, 1, "mallory")]
        assert await audit(actor="WAYNE") == [(a, 1, "wayne"), (a, 2, "wayne")]
        half_past = T0 + timedelta(minutes=30)
        assert await audit(since=half_past.isoformat()) == [(a, 2, "wayne"), (b, 1, "mallory")]
        # The same instant written in another offset, and without one (read as UTC).
        east = half_past.astimezone(timezone(timedelta(hours=2)))
        assert await audit(since=east.isoformat()) == [(a, 2, "wayne"), (b, 1, "mallory")]
        assert await audit(since=half_past.replace(tzinfo=None).isoformat()) == [
            (a, 2, "wayne"),
            (b, 1, "mallory"),
        ]
        assert await audit(ticket=a, actor="mallory") == []
        assert await audit(ticket=a, since=(T0 + timedelta(hours=1)).isoformat()) == [(a, 2, "wayne")]

        answer = await api.get("/audit", params={"since": "last tuesday"}, headers=as_("wayne"))
        assert answer.status_code == 422 and "since" in answer.json()["detail"]
        assert (await api.get("/audit")).status_code == 401
        decided = (
            await api.get("/audit", params={"ticket": a, "actor": "wayne"}, headers=as_("wayne"))
        ).json()
        assert decided[1]["kind"] == "decided" and decided[1]["summary"] == "decided by wayne"
