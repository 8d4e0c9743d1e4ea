"""/questions, /rulings and the Slack button on the real dev server and store: a question filed over HTTP is
posted to Slack, a click on its button answers it, and the ruling is listed; refusals say why and start nothing."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.slack.settings import SlackSettings
from tests.api.conftest import SIGNING_SECRET, as_
from tests.slack.fake_slack import FakeSlack
from tests.slack.signing import click, form_body, sign
from tests.support import running_workers

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "questions"


def question(name: str, task_queue: str, **changes: Any) -> dict[str, Any]:
    data = yaml.safe_load((EXAMPLES / name).read_text())
    data["deadline"] = (datetime.now(UTC) + timedelta(days=1)).isoformat()  # the API takes an instant
    return {**data, "id": f"{data['id']}-{task_queue[-8:]}", "deciders": ["wayne"], **changes}


async def until(check: Any, limit: float = 30) -> Any:
    deadline = time.monotonic() + limit
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.2)


async def test_a_question_asked_over_http_is_answered_from_slack_and_its_ruling_listed(
    api: httpx.AsyncClient,
    slack: FakeSlack,
    slack_settings: SlackSettings,
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    body = question("kv-always-tbq.yaml", task_queue)
    async with running_workers(
        temporal_client, sqlite_engine, tmp_path, task_queue, "local", slack=slack_settings
    ):
        asked = await api.post("/questions", json=body, headers=as_("lead"))
        assert asked.status_code == 201, asked.text
        assert asked.json()["asked_by"] == "lead" and asked.json()["deciders"] == ["wayne"]
        again = await api.post("/questions", json=body, headers=as_("lead"))
        assert again.status_code == 409 and "asked before" in again.json()["detail"]

        async def posted() -> dict[str, Any] | None:
            return next((p for p in slack.posts if f"{body['id']}-question-1" in str(p)), None)

        message = await until(posted)
        assert "Question for the deciders" in str(message["blocks"])
        listed = (await api.get("/questions?pending=true", headers=as_("mallory"))).json()
        assert [q["request_id"] for q in listed if q["request_id"].startswith(body["id"])] == [
            f"{body['id']}-question-1"
        ]

        # mallory's click is refused by the question's own deciders; wayne's answers it
        payload = click(message, "rule", user="UMALLORY", response_url=slack.response_url("m"))
        form = form_body(payload)
        assert (
            await api.post("/slack/interactions", content=form, headers=sign(SIGNING_SECRET, form))
        ).status_code == 200
        payload = click(message, "rule", user="UWAYNE", response_url=slack.response_url("w"))
        form = form_body(payload)
        assert (
            await api.post("/slack/interactions", content=form, headers=sign(SIGNING_SECRET, form))
        ).status_code == 200

        async def ruled() -> dict[str, Any] | None:
            state = (await api.get(f"/questions/{body['id']}", headers=as_("wayne"))).json()
            return state if state["status"] == "ruled" else None

        state = await until(ruled)
    assert state["decided_by"] == "wayne" and state["ruling"]["ruled_by"] == "wayne"
    replies = {reply["_path"].rsplit("/", 1)[-1]: reply["text"] for reply in slack.responses}
    assert "mallory may not decide question" in replies["m"]
    assert "wayne* chose *rule*" in replies["w"]
    rulings = (await api.get("/rulings", headers=as_("mallory"))).json()
    assert [(r["id"], r["ruled_by"], r["rule"]["field"]) for r in rulings] == [
        (body["id"], "wayne", "kv_cache_dtype")
    ]


async def test_a_question_answered_over_http_answers_with_its_closed_state(
    api: httpx.AsyncClient, temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    body = question("dense-models.yaml", task_queue)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, "local"):
        assert (await api.post("/questions", json=body, headers=as_("lead"))).status_code == 201

        async def open_() -> dict[str, Any] | None:
            state = (await api.get(f"/questions/{body['id']}", headers=as_("wayne"))).json()
            return state if state.get("pending_decision") else None

        request = (await until(open_))["pending_decision"]
        answer = {
            "request_id": request["id"],
            "option": "qwen-only",
            "decided_by": "wayne",
            "note": "qwen first",
        }
        refused = await api.post("/decisions", json=answer, headers=as_("mallory"))
        assert refused.status_code == 403 and "decided_by" in refused.json()["detail"]
        done = await api.post("/decisions", json=answer, headers=as_("wayne"))
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "answered" and done.json()["outcome"] == "qwen-only"
        assert done.json()["note"] == "qwen first" and done.json()["ruling"] is None
    assert (await api.get("/rulings", headers=as_("wayne"))).json() == []


async def test_bad_questions_are_refused_with_the_field(api: httpx.AsyncClient, task_queue: str) -> None:
    body = question("kv-always-tbq.yaml", task_queue)
    bad_rule = {**body, "rule": {**body["rule"], "values": ["tbq"]}}
    answer = await api.post("/questions", json=bad_rule, headers=as_("lead"))
    assert answer.status_code == 422 and "'tbq' is not a vllm kv_cache_dtype" in answer.text
    past = await api.post(
        "/questions", json={**body, "deadline": "2020-01-01T00:00:00Z"}, headers=as_("lead")
    )
    assert past.status_code in (400, 409, 422) and "has passed" in past.json()["detail"]
    assert (await api.get(f"/questions/{body['id']}", headers=as_("lead"))).status_code == 404
    unauthenticated = await api.post("/questions", json=body)
    assert unauthenticated.status_code == 401
