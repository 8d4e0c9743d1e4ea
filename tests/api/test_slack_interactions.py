"""POST /slack/interactions edge cases: what is not a decision click, what is not configured, what is not Slack's."""

from __future__ import annotations

import json

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
from tests.slack.fake_slack import FakeSlack
from tests.slack.signing import click, form_body, sign

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


def test_settings_refuse_names_that_are_not_people() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not Daedalus people"):
        SlackSettings(users={"U1": "Wayne Smith"})
    with pytest.raises(ValidationError, match="no longer read: API tokens are now stored hashed"):
        ApiSettings(tokens={"t": "wayne"})  # type: ignore[call-arg]
    assert SlackSettings(users={"U1": "Wayne"}, signing_secret=SecretStr("s")).users == {"U1": "wayne"}
