"""The HTTP API on the real dev server and store: filing, refusals, decisions, delegation, amendment, cancel."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment

from daedalus.activities.notify import NotifyActivities
from daedalus.ids import ticket_workflow_id
from daedalus.schemas.ticket import DecisionRequest, TicketSpec, TicketState, TicketStatus
from daedalus.slack.settings import SlackSettings
from daedalus.store import queries
from daedalus.store.database import session_scope
from tests.api.conftest import SIGNING_SECRET, as_
from tests.slack.fake_slack import FakeSlack
from tests.slack.signing import click, form_body, sign
from tests.support import make_engine_repo, running_workers, ticket_spec

APPROVAL = {"dispatch_requires_approval": True, "deciders": ["wayne"]}


def body_of(spec: TicketSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", exclude_defaults=True)


async def assert_no_workflow(client: Client, ticket_id: str) -> None:
    with pytest.raises(RPCError) as raised:
        await client.get_workflow_handle(ticket_workflow_id(ticket_id)).describe()
    assert raised.value.status is RPCStatusCode.NOT_FOUND


async def pending(api: httpx.AsyncClient, ticket_id: str, timeout: float = 30) -> dict[str, Any]:
    """Poll GET /tickets/{id} until the ticket waits for a decision; returns the request."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        answer = await api.get(f"/tickets/{ticket_id}", headers=as_("wayne"))
        if answer.status_code == 200 and (answer.json()["live"] or {}).get("pending_decision"):
            request: dict[str, Any] = answer.json()["live"]["pending_decision"]
            return request
        assert asyncio.get_running_loop().time() < deadline, (
            f"never pending: {answer.status_code} {answer.text}"
        )
        await asyncio.sleep(0.2)


async def test_bad_spec_is_422_with_field_paths_and_starts_nothing(
    api: httpx.AsyncClient, temporal_client: Client
) -> None:
    ticket_id = f"bad{uuid.uuid4().hex[:6]}"
    spec = {
        "id": ticket_id,
        "title": "bad",
        "host": "h1",
        "agent": {"name": "scripted", "patch": "x"},
        "gates": [{"name": "decode", "metric": "decode_tps", "threshold": "fast", "command": "true"}],
        "max_attempts": 99,
    }
    answer = await api.post("/tickets", json=spec, headers=as_("wayne"))
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert "gates.0.threshold" in detail and "'fast'" in detail
    assert "max_attempts" in detail and "99" in detail
    assert {"gates.0.threshold", "max_attempts"} <= {p["field"] for p in answer.json()["problems"]}
    await assert_no_workflow(temporal_client, ticket_id)

    # A whole-spec rule (not one field) is reported at the top level.
    answer = await api.post(
        "/tickets", json={"id": ticket_id, "title": "t", "host": "h1"}, headers=as_("wayne")
    )
    assert answer.status_code == 422 and "(top level)" in answer.json()["detail"]
    assert "umbrella" in answer.json()["detail"]
    await assert_no_workflow(temporal_client, ticket_id)

    # No token, no ticket, even with a valid spec.
    valid = {**spec, "gates": [], "max_attempts": 1}
    answer = await api.post("/tickets", json=valid)
    assert answer.status_code == 401 and "Bearer" in answer.json()["detail"]
    answer = await api.post("/tickets", json=valid, headers={"Authorization": "Bearer nope"})
    assert answer.status_code == 401
    await assert_no_workflow(temporal_client, ticket_id)


async def test_duplicate_live_ticket_is_409_and_unknown_ticket_is_404(
    api: httpx.AsyncClient, temporal_client: Client, tmp_path: Path
) -> None:
    # No workers: the ticket stays live (its first task not even run), which is all a duplicate needs.
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), "h1", approval=APPROVAL)
    first = await api.post("/tickets", json=body_of(spec), headers=as_("wayne"))
    assert first.status_code == 201, first.text
    filed = first.json()
    assert filed["workflow_id"] == f"ticket-{spec.id}" and filed["filed_by"] == "wayne" and filed["run_id"]
    try:
        second = await api.post("/tickets", json=body_of(spec), headers=as_("mallory"))
        assert second.status_code == 409
        assert f"ticket {spec.id} is already live" in second.json()["detail"]
        description = await temporal_client.get_workflow_handle(filed["workflow_id"]).describe()
        assert description.run_id == filed["run_id"]  # the first filing is untouched
    finally:
        await temporal_client.get_workflow_handle(filed["workflow_id"]).terminate("test over")

    missing = await api.get(f"/tickets/nope{uuid.uuid4().hex[:6]}", headers=as_("wayne"))
    assert missing.status_code == 404 and "GET /tickets" in missing.json()["detail"]


async def test_file_over_http_and_approve_with_a_slack_button(
    api: httpx.AsyncClient,
    slack: FakeSlack,
    slack_settings: SlackSettings,
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    host = f"h-{task_queue[-8:]}"
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        filed = await api.post("/tickets", json=body_of(spec), headers=as_("wayne"))
        assert filed.status_code == 201, filed.text
        request = DecisionRequest.model_validate(await pending(api, spec.id))
        assert request.id == f"{spec.id}-dispatch-1" and request.options == ["approve", "reject"]

        # The workflow's notify activity posts the request with its buttons.
        posted = await ActivityEnvironment().run(
            NotifyActivities(slack_settings, tmp_path / "ledger").notify_decision_request, request
        )
        [message] = slack.posts
        assert posted.ts == message["ts"]

        # wayne clicks "approve"; Slack signs the click and posts it to the interactions endpoint.
        payload = click(message, "approve", user="UWAYNE", response_url=slack.response_url("approve"))
        body = form_body(payload)
        answer = await api.post("/slack/interactions", content=body, headers=sign(SIGNING_SECRET, body))
        assert answer.status_code == 200 and answer.content == b""

        final = TicketState.model_validate(
            await temporal_client.get_workflow_handle(ticket_workflow_id(spec.id)).result()
        )
        shown = (await api.get(f"/tickets/{spec.id}", headers=as_("mallory"))).json()
        assert shown["live"]["status"] == "passed" and shown["live"]["decisions"][0]["channel"] == "slack"
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    [decision] = final.decisions
    assert (decision.decided_by, decision.option, decision.channel) == ("wayne", "approve", "slack")
    [reply] = slack.responses
    assert reply["replace_original"] is True and "*wayne* chose *approve*" in reply["text"]
    assert reply["_path"] == "/actions/approve"

    # Workers gone: the final state comes from the closed workflow's history instead of a query.
    shown = (await api.get(f"/tickets/{spec.id}", headers=as_("mallory"))).json()
    assert shown["live"]["status"] == "passed"
    assert shown["projection"]["status"] == "passed" and shown["projection"]["closed_at"]
    [verdict] = shown["verdicts"]
    assert verdict["verdict"] == "PASS" and verdict["gate"] == "decode" and len(verdict["samples"]) == 7
    listed = (await api.get("/tickets", params={"status": "passed"}, headers=as_("wayne"))).json()
    assert spec.id in [t["ticket_id"] for t in listed]
    decided = (await api.get("/decisions", params={"ticket": spec.id}, headers=as_("wayne"))).json()
    assert [(d["decided_by"], d["channel"], d["option"]) for d in decided] == [("wayne", "slack", "approve")]

    trail = (
        await api.get("/audit", params={"ticket": spec.id, "actor": "wayne"}, headers=as_("wayne"))
    ).json()
    assert [e["kind"] for e in trail] == ["filed", "decided"]
    assert trail[1]["detail"]["channel"] == "slack"
    with session_scope(sqlite_engine) as session:
        rows = queries.decisions(session=session, ticket_id=spec.id)
    assert rows[0].channel == "slack" and rows[0].decided_by == "wayne"


async def test_refused_decisions_write_nothing(
    api: httpx.AsyncClient,
    slack: FakeSlack,
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    host = f"h-{task_queue[-8:]}"
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        assert (await api.post("/tickets", json=body_of(spec), headers=as_("wayne"))).status_code == 201
        request = await pending(api, spec.id)
        rid = request["id"]

        async def decide(person: str, **decision: str) -> httpx.Response:
            return await api.post(
                "/decisions",
                json={"request_id": rid, "option": "approve", "decided_by": person, **decision},
                headers=as_(person),
            )

        cases = [
            (await decide("wayne", request_id=f"{spec.id}-dispatch-9"), 404, "unknown decision request"),
            (await decide("wayne", option="ship-it"), 409, "unknown option 'ship-it'"),
            (await decide("mallory"), 409, "mallory may not decide dispatch"),
            (await decide("wayne", request_id="not-a-request"), 404, "unknown decision request"),
            (await decide("wayne", decided_by="Bad Name"), 422, "decided_by"),
        ]
        impersonation = await api.post(
            "/decisions",
            json={"request_id": rid, "option": "approve", "decided_by": "wayne"},
            headers=as_("mallory"),
        )
        cases.append((impersonation, 403, "your token belongs to 'mallory'"))
        cases.append(
            (
                await api.post(
                    "/decisions", json={"request_id": rid, "option": "approve", "decided_by": "wayne"}
                ),
                401,
                "Bearer",
            )
        )
        for answer, code, words in cases:
            assert answer.status_code == code, (words, answer.text)
            assert words in answer.json()["detail"], (words, answer.text)

        # Slack: a forged signature, a stale one, an unlinked user, a linked user without authority.
        message = {
            "ts": "1.000001",
            "channel": "C0DECISIONS",
            "text": request["question"],
            "blocks": [
                {
                    "type": "actions",
                    "block_id": f"decide:{rid}",
                    "elements": [
                        {
                            "type": "button",
                            "action_id": "decide:approve",
                            "text": {"type": "plain_text", "text": "approve"},
                            "value": json.dumps({"request_id": rid, "option": "approve"}),
                        }
                    ],
                }
            ],
        }
        body = form_body(click(message, "approve", user="UWAYNE", response_url=slack.response_url("forged")))
        forged = await api.post("/slack/interactions", content=body, headers=sign("not-the-secret", body))
        stale = await api.post(
            "/slack/interactions", content=body, headers=sign(SIGNING_SECRET, body, timestamp=1_700_000_000)
        )
        unsigned = await api.post(
            "/slack/interactions", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        assert [forged.status_code, stale.status_code, unsigned.status_code] == [401, 401, 401]
        tampered = body.replace(b"UWAYNE", b"UMALLORY")
        assert (
            await api.post("/slack/interactions", content=tampered, headers=sign("x", body))
        ).status_code == 401
        assert not slack.responses

        for user in ("USTRANGER", "UMALLORY"):
            body = form_body(click(message, "approve", user=user, response_url=slack.response_url(user)))
            answer = await api.post("/slack/interactions", content=body, headers=sign(SIGNING_SECRET, body))
            assert answer.status_code == 200
        stranger, mallory = slack.responses
        assert stranger["response_type"] == "ephemeral" and stranger["replace_original"] is False
        assert "USTRANGER is not linked" in stranger["text"]
        assert (
            mallory["response_type"] == "ephemeral" and "mallory may not decide dispatch" in mallory["text"]
        )

        state = TicketState.model_validate(
            (await api.get(f"/tickets/{spec.id}", headers=as_("wayne"))).json()["live"]
        )
        assert state.status is TicketStatus.AWAITING_APPROVAL and not state.decisions
        assert state.pending_decision is not None and state.pending_decision.id == rid
        with session_scope(sqlite_engine) as session:
            kinds = [e.kind for e in queries.audit_events(session=session, ticket_id=spec.id)]
            [row] = queries.decisions(session=session, ticket_id=spec.id)
        assert "decided" not in kinds and row.decided_at is None

        # Delegation, amendment and cancel, each only as oneself and only by someone allowed.
        answer = await api.post(
            f"/tickets/{spec.id}/delegations",
            json={"granted_by": "mallory", "delegate": "lead"},
            headers=as_("mallory"),
        )
        assert answer.status_code == 409 and "mallory is not a decider" in answer.json()["detail"]
        answer = await api.post(
            f"/tickets/{spec.id}/delegations",
            json={"granted_by": "wayne", "delegate": "lead"},
            headers=as_("lead"),
        )
        assert answer.status_code == 403
        answer = await api.post(
            f"/tickets/{spec.id}/delegations",
            json={"granted_by": "wayne", "delegate": "lead"},
            headers=as_("wayne"),
        )
        assert answer.status_code == 200 and answer.json() == {
            "ticket_id": spec.id,
            "kind": "escalation",  # the default: what a run-time delegation can always be honoured for
            "delegates": ["lead"],
        }
        answer = await api.post(
            f"/tickets/{spec.id}/amendments", json={"amended_by": "wayne"}, headers=as_("wayne")
        )
        assert answer.status_code == 409 and "must change" in answer.json()["detail"]
        answer = await api.post(
            f"/tickets/{spec.id}/amendments",
            json={"amended_by": "wayne", "max_attempts": 1, "note": "one go"},
            headers=as_("wayne"),
        )
        assert answer.status_code == 200 and answer.json()["spec"]["max_attempts"] == 1
        answer = await api.post(
            f"/tickets/{spec.id}/cancel",
            json={"requested_by": "lead", "reason": "superseded"},
            headers=as_("lead"),
        )
        assert answer.status_code == 200, answer.text
        final = TicketState.model_validate(
            await temporal_client.get_workflow_handle(ticket_workflow_id(spec.id)).result()
        )
        answer = await api.post(
            f"/tickets/{spec.id}/cancel",
            json={"requested_by": "wayne", "reason": "again"},
            headers=as_("wayne"),
        )
        assert answer.status_code == 404 and "is not live" in answer.json()["detail"], answer.text
    assert final.status is TicketStatus.CANCELLED and "cancelled by lead: superseded" in final.outcome_reason
    assert not final.decisions
