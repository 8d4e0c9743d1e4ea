"""The HTTP API under the server's policy: a spec that loosens its approval is 403 with the reason, the filer's
own dispatch answer is 403, and POST /tickets/{id}/terminate closes a waiting ticket's trail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.api import create_app
from daedalus.api.settings import ApiSettings
from daedalus.decisions.policy import Policy
from daedalus.slack.settings import SlackSettings
from daedalus.store import chain
from daedalus.store.database import session_scope
from tests.api.conftest import as_, install_tokens
from tests.support import TEST_AUDIT_KEY, gate_command, make_engine_repo, running_workers, ticket_spec
from tests.ticket_helpers import events, host_of


def policy_for(host: str) -> Policy:
    return Policy.model_validate(
        {
            "people": {
                "wayne": {"roles": ["decider"]},
                "lead": {"roles": ["lead"]},
                "mallory": {"roles": ["filer"]},
            },
            "hosts": {host: {"operators": []}},
            "delegations": [{"granted_by": "wayne", "delegate": "lead"}],
        }
    )


@pytest.fixture
async def policed(
    temporal_client: Client, store_engine: Engine, task_queue: str
) -> AsyncIterator[httpx.AsyncClient]:
    install_tokens(store_engine)
    app = create_app(
        client=temporal_client,
        engine=store_engine,
        control_queue=task_queue,
        settings=ApiSettings(update_timeout_s=10),
        slack=SlackSettings(),
        policy=policy_for(host_of(task_queue)),
        audit_key=TEST_AUDIT_KEY,
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://daedalus"
    ) as client:
        yield client


async def test_the_api_enforces_the_policy_and_terminates_as_a_last_resort(
    policed: httpx.AsyncClient,
    temporal_client: Client,
    store_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    host = host_of(task_queue)
    repo = make_engine_repo(tmp_path / "repo")
    gates = [{"name": "decode", "metric": "decode_tps", "threshold": 20, "command": gate_command()}]
    loose = ticket_spec(repo, host, agent=None, build=None, gates=gates, approval={"deciders": ["mallory"]})
    body = loose.model_dump(mode="json", exclude_defaults=True)
    refused = await policed.post("/tickets", json=body, headers=as_("mallory"))
    assert refused.status_code == 403
    assert (
        "approval.deciders names ['mallory'], who are not deciders in the policy" in refused.json()["detail"]
    )

    spec = ticket_spec(repo, host, agent=None, build=None, gates=gates, approval={})
    async with running_workers(temporal_client, store_engine, tmp_path, task_queue, host):
        filed = await policed.post(
            "/tickets", json=spec.model_dump(mode="json", exclude_defaults=True), headers=as_("mallory")
        )
        assert filed.status_code == 201, filed.text
        request = f"{spec.id}-dispatch-1"
        for _ in range(300):
            pending = await policed.get("/decisions", params={"pending": "true"}, headers=as_("wayne"))
            if any(d["request_id"] == request for d in pending.json()):
                break
            await asyncio.sleep(0.2)
        own = {"request_id": request, "option": "approve", "decided_by": "mallory"}
        answered = await policed.post("/decisions", json=own, headers=as_("mallory"))
        assert answered.status_code == 403 and "mallory filed ticket" in answered.json()["detail"]

        stop = {"requested_by": "mallory", "reason": "wedged"}
        forbidden = await policed.post(f"/tickets/{spec.id}/terminate", json=stop, headers=as_("mallory"))
        assert forbidden.status_code == 403 and "mallory may not terminate" in forbidden.json()["detail"]
        stop = {"requested_by": "wayne", "reason": "wedged"}
        closed = await policed.post(f"/tickets/{spec.id}/terminate", json=stop, headers=as_("wayne"))
        assert closed.status_code == 200, closed.text
        [event] = closed.json()
        assert event["status"] == "terminated" and event["kind"] == "closed" and event["actor"] == "wayne"
    trail = events(store_engine, spec.id)
    assert trail[-1].status == "terminated" and trail[-1].seq == len(trail)
    with session_scope(store_engine) as session:
        checked, breaks = chain.verify(session, [spec.id], key=TEST_AUDIT_KEY)
    assert checked == len(trail) and not breaks
