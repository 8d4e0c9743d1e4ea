"""POST /slack/interactions edge cases: what is not a decision click, what is not configured, what is not Slack's,
and a ticket that does not answer in time."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.api import create_app
from daedalus.api.settings import ApiSettings
from daedalus.ports import free_port
from daedalus.services import connect
from daedalus.slack.settings import SlackSettings
from tests.api.conftest import SIGNING_SECRET, as_, install_tokens
from tests.api.test_tickets import APPROVAL, body_of, pending
from tests.slack.fake_slack import FakeSlack
from tests.slack.signing import click, form_body, sign
from tests.support import make_engine_repo, running_workers, ticket_spec

MESSAGE = {
    "ts": "1.000001",
    "channel": "C0DECISIONS",
    "text": "Dispatch?",
    "blocks": [
        {
            "type": "actions",
            "block_id": "decide:x-dispatch-1",
            "elements": [
                {
                    "type": "button",
                    "action_id": "decide:approve",
                    "text": {"type": "plain_text", "text": "approve"},
                    "value": json.dumps({"request_id": "x-dispatch-1", "option": "approve"}),
                }
            ],
        }
    ],
}


async def test_clicks_that_are_not_decisions(api: httpx.AsyncClient, slack: FakeSlack) -> None:
    payload = click(MESSAGE, "approve", user="UWAYNE", response_url=slack.response_url("forged"))
    payload["actions"][0]["value"] = '{"option": "approve"}'  # not a value Daedalus made
    body = form_body(payload)
    answer = await api.post("/slack/interactions", content=body, headers=sign(SIGNING_SECRET, body))
    assert answer.status_code == 200
    [refusal] = slack.responses
    assert refusal["response_type"] == "ephemeral" and "does not carry a Daedalus decision" in refusal["text"]

    other = {"type": "view_submission", "user": {"id": "UWAYNE"}, "view": {}}
    body = form_body(other)
    answer = await api.post("/slack/interactions", content=body, headers=sign(SIGNING_SECRET, body))
    assert answer.status_code == 200 and len(slack.responses) == 1  # acknowledged, ignored

    body = b"nothing=here"
    answer = await api.post("/slack/interactions", content=body, headers=sign(SIGNING_SECRET, body))
    assert answer.status_code == 400 and "payload" in answer.json()["detail"]


async def test_not_configured_and_temporal_unreachable(sqlite_engine: Engine) -> None:
    dead = f"127.0.0.1:{free_port()}"

    async def unreachable() -> Client:
        return await connect(dead)

    install_tokens(sqlite_engine)
    app = create_app(
        client_factory=unreachable,
        engine=sqlite_engine,
        control_queue="q",
        settings=ApiSettings(),
        slack=SlackSettings(signing_secret=None, users={}),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://daedalus") as api:
        body = form_body(click(MESSAGE, "approve", user="UWAYNE", response_url="http://127.0.0.1:9/x"))
        answer = await api.post("/slack/interactions", content=body, headers=sign(SIGNING_SECRET, body))
        assert answer.status_code == 503 and "DAEDALUS_SLACK_SIGNING_SECRET" in answer.json()["detail"]
        answer = await api.get("/tickets/t1", headers=as_("wayne"))
        assert answer.status_code == 503 and f"cannot reach Temporal at {dead}" in answer.json()["detail"]
        # The store side still answers without Temporal.
        assert (await api.get("/tickets", headers=as_("wayne"))).json() == []


async def test_a_ticket_without_a_worker_gets_the_clicker_a_no_answer_reply(
    api: httpx.AsyncClient,
    slack: FakeSlack,
    slack_settings: SlackSettings,
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    """The decide update cut short by the API's timeout is the SDK's own error, not TimeoutError; the clicker
    still hears that the ticket did not answer."""
    host = f"h-{task_queue[-8:]}"
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        filed = await api.post("/tickets", json=body_of(spec), headers=as_("wayne"))
        assert filed.status_code == 201, filed.text
        request = await pending(api, spec.id)
    # Workers gone: nothing applies the update before the API stops waiting.
    impatient = create_app(
        client=temporal_client,
        engine=sqlite_engine,
        control_queue=task_queue,
        settings=ApiSettings(update_timeout_s=1),
        slack=slack_settings,
    )
    message = copy.deepcopy(MESSAGE)
    block: dict[str, Any] = message["blocks"][0]  # type: ignore[index]
    block["block_id"] = f"decide:{request['id']}"
    block["elements"][0]["value"] = json.dumps({"request_id": request["id"], "option": "approve"})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=impatient), base_url="http://d") as late:
        payload = click(message, "approve", user="UWAYNE", response_url=slack.response_url("late"))
        body = form_body(payload)
        answer = await late.post("/slack/interactions", content=body, headers=sign(SIGNING_SECRET, body))
    assert answer.status_code == 200
    [reply] = slack.responses
    assert reply["replace_original"] is False
    assert f"No answer from ticket {request['id']} within 1s; it may still apply" in reply["text"]
    await temporal_client.get_workflow_handle(f"ticket-{spec.id}").terminate("test over")


def test_settings_refuse_names_that_are_not_people() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not Daedalus people"):
        SlackSettings(users={"U1": "Wayne Smith"})
    with pytest.raises(ValidationError, match="no longer read: API tokens are now stored hashed"):
        ApiSettings(tokens={"t": "wayne"})  # type: ignore[call-arg]
    assert SlackSettings(users={"U1": "Wayne"}, signing_secret=SecretStr("s")).users == {"U1": "wayne"}
