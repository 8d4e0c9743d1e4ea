"""POST /decisions answers with the ticket's state after the decision, not the state the update saw."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.schemas.ticket import TicketStatus
from tests.api.conftest import as_
from tests.api.test_tickets import APPROVAL, body_of, pending
from tests.support import make_engine_repo, running_workers, ticket_spec


async def test_the_answer_holds_the_decision_and_the_state_after_it(
    api: httpx.AsyncClient, temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"h-{task_queue[-8:]}"
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        assert (await api.post("/tickets", json=body_of(spec), headers=as_("wayne"))).status_code == 201
        request = await pending(api, spec.id)
        answer = await api.post(
            "/decisions",
            json={"request_id": request["id"], "option": "reject", "decided_by": "wayne", "note": "not now"},
            headers=as_("wayne"),
        )
        assert answer.status_code == 200, answer.text
        state = answer.json()
        assert state["pending_decision"] is None
        assert [(d["request_id"], d["option"], d["channel"]) for d in state["decisions"]] == [
            (request["id"], "reject", "api")
        ]
        assert state["status"] != TicketStatus.AWAITING_APPROVAL.value
