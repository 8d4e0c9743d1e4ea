"""Inputs nobody thought of: schemathesis draws requests from the API's own OpenAPI document, valid and
invalid, against `daedalus api serve` in a real process on the session's Temporal dev server.

No answer may be a 5xx, and every refusal must carry a `detail` a person can read. A few dozen examples per
operation and mode keep this under a minute.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, Case, GenerationMode

from daedalus.devserver import DevServer
from daedalus.ports import free_port
from tests.api.conftest import SIGNING_SECRET, as_, install_tokens_under

PERSON_FIELDS = ("decided_by", "amended_by", "requested_by", "granted_by")
EXAMPLES = 8


@pytest.fixture
def served_api(temporal_server: DevServer, tmp_path: Path, task_queue: str) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address,
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "DAEDALUS_CONTROL_QUEUE": task_queue,
        "DAEDALUS_SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "DAEDALUS_API_UPDATE_TIMEOUT_S": "3",
    }
    install_tokens_under(tmp_path / "home")
    command = [sys.executable, "-c", "from daedalus.cli.api import app; app()", "serve", "--port", str(port)]
    log = (tmp_path / "api.log").open("wb")
    server = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def as_the_caller(case: Case) -> None:
    """Most positive cases would stop at 403 (acting as someone else); act as the token's person instead, so
    that the request reaches Temporal and the store."""
    if isinstance(case.body, dict):
        for field in PERSON_FIELDS:
            if field in case.body:
                case.body[field] = "wayne"


def explore(
    operation: APIOperation, mode: GenerationMode, base_url: str, seen: Counter[tuple[str, str, int]]
) -> list[str]:
    """Call one operation with drawn requests; the problems found, as lines."""
    failures: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(operation.as_strategy(generation_mode=mode))
    def call(case: Case) -> None:
        if mode is GenerationMode.POSITIVE:
            as_the_caller(case)
        answer = case.call(base_url=base_url, headers=as_("wayne"), timeout=30)
        seen[(operation.label, mode.value, answer.status_code)] += 1
        if answer.status_code >= 500:
            failures.append(f"{operation.label} -> {answer.status_code} {answer.text[:300]}")
        elif answer.status_code >= 400 and not answer.json().get("detail"):
            failures.append(f"{operation.label} -> {answer.status_code} without a detail")

    # Unsatisfiable: no invalid request exists for this operation's schema (a form of free text)
    with contextlib.suppress(Unsatisfiable):
        call()
    return failures


def test_no_request_drawn_from_the_openapi_document_gets_a_server_error(served_api: str) -> None:
    schema = schemathesis.openapi.from_url(f"{served_api}/openapi.json", wait_for_schema=30)
    seen: Counter[tuple[str, str, int]] = Counter()
    failures = [
        failure
        for result in schema.get_all_operations()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        for failure in explore(result.ok(), mode, served_api, seen)
    ]
    assert not failures, "\n".join(failures)
    operations = {label for label, _, _ in seen}
    assert {
        "POST /tickets",
        "POST /decisions",
        "GET /audit",
        "POST /tickets/{ticket_id}/cancel",
    } <= operations
    assert sum(seen.values()) > 100, seen
