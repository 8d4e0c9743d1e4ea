"""Bounded resources in the API: bodies are limited before authentication, refusals are 413/422 with a
message a person can act on, never 500/502 with Temporal's gRPC text; attacks that used to wedge a ticket."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from daedalus.api.limits import MAX_BODY_BYTES
from daedalus.ids import ticket_workflow_id as workflow_id
from daedalus.schemas.limits import BRIEF_CHARS
from tests.api.conftest import as_
from tests.api.test_tickets import APPROVAL, assert_no_workflow, body_of
from tests.support import make_engine_repo, ticket_spec

MiB = 1024 * 1024


class CountingBody:
    """A request body of `total` bytes sent in 64 KiB chunks, counting what the server actually pulled."""

    def __init__(self, total: int) -> None:
        self.total, self.sent = total, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunk = b"x" * (64 * 1024)
        while self.sent < self.total:
            self.sent += len(chunk)
            yield chunk


async def test_a_200_megabyte_body_with_a_bad_token_is_refused_after_reading_at_most_the_limit(
    api: httpx.AsyncClient,
) -> None:
    body = CountingBody(200 * MiB)
    answer = await api.post(
        "/tickets",
        content=body,
        headers={"Authorization": "Bearer not-a-token", "Content-Type": "application/json"},
    )
    assert answer.status_code == 413, answer.text
    assert f"the limit is {MAX_BODY_BYTES} bytes" in answer.json()["detail"]
    assert body.sent <= MAX_BODY_BYTES + 64 * 1024, f"read {body.sent} bytes of a refused body"


async def test_a_declared_length_over_the_limit_is_refused_before_reading_any_of_it(
    api: httpx.AsyncClient,
) -> None:
    answer = await api.post(
        "/decisions",
        content=b"{}",
        headers={"Authorization": "Bearer nope", "Content-Length": str(200 * MiB)},
    )
    assert answer.status_code == 413 and "declares 209715200 bytes" in answer.json()["detail"]


@pytest.mark.parametrize("path", ["/tickets", "/decisions", "/tickets/x/cancel", "/tickets/x/amendments"])
async def test_a_ten_megabyte_note_or_brief_is_413_with_a_message(api: httpx.AsyncClient, path: str) -> None:
    big = "n" * (10 * MiB)
    body = {"id": "x", "title": "t", "host": "h", "spec": big, "note": big, "reason": big}
    answer = await api.post(path, json=body, headers=as_("wayne"))
    assert answer.status_code == 413, answer.text
    assert "put long briefs, patches and data in the repository" in answer.json()["detail"]


async def test_a_brief_under_the_body_limit_but_over_its_own_is_422_and_starts_nothing(
    api: httpx.AsyncClient, temporal_client: Client, tmp_path: Path
) -> None:
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), "h1")
    body = {**body_of(spec), "spec": "b" * (BRIEF_CHARS + 1)}
    answer = await api.post("/tickets", json=body, headers=as_("wayne"))
    assert answer.status_code == 422, answer.text
    assert f"spec: String should have at most {BRIEF_CHARS} characters" in answer.json()["detail"]
    await assert_no_workflow(temporal_client, spec.id)


@pytest.mark.parametrize("threshold", ["NaN", "Infinity", "-Infinity", "1e400"])
async def test_a_non_finite_threshold_is_422(api: httpx.AsyncClient, tmp_path: Path, threshold: str) -> None:
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), "h1")
    text = json.dumps(body_of(spec)).replace('"threshold": 55.0', f'"threshold": {threshold}')
    assert threshold in text
    answer = await api.post(
        "/tickets", content=text, headers={**as_("wayne"), "Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    assert "gates.0.threshold" in answer.json()["detail"]


async def test_a_reserved_ticket_id_is_422_and_starts_nothing(
    api: httpx.AsyncClient, temporal_client: Client, tmp_path: Path
) -> None:
    ticket_id = f"training-{uuid.uuid4().hex[:6]}"
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), "h1", id=ticket_id)
    answer = await api.post("/tickets", json=body_of(spec), headers=as_("wayne"))
    assert (
        answer.status_code == 422
        and "reserves for the subjects of training runs and campaigns" in answer.json()["detail"]
    )
    await assert_no_workflow(temporal_client, ticket_id)


async def test_a_child_id_equal_to_a_live_ticket_is_refused_at_filing(
    api: httpx.AsyncClient, temporal_client: Client, tmp_path: Path
) -> None:
    repo = make_engine_repo(tmp_path / "repo")
    live = ticket_spec(repo, "h1", approval=APPROVAL)
    assert (await api.post("/tickets", json=body_of(live), headers=as_("wayne"))).status_code == 201
    child: dict[str, Any] = {**body_of(live), "title": "a child that reuses a live id"}
    umbrella_id = f"u{uuid.uuid4().hex[:6]}"
    umbrella = {"id": umbrella_id, "title": "umbrella", "host": "h1", "children": [child]}
    answer = await api.post("/tickets", json=umbrella, headers=as_("wayne"))
    assert answer.status_code == 422, answer.text
    assert f"sub-ticket {live.id} of {umbrella_id} is already live" in answer.json()["detail"]
    await assert_no_workflow(temporal_client, umbrella_id)
    await temporal_client.get_workflow_handle(workflow_id(live.id)).terminate("test over")


async def test_a_path_id_that_is_not_a_slug_is_422(api: httpx.AsyncClient) -> None:
    answer = await api.post(
        "/tickets/a%20b/cancel", json={"requested_by": "wayne", "reason": "r"}, headers=as_("wayne")
    )
    assert answer.status_code == 422, answer.text
