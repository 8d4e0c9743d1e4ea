"""The CLI against a shared stack: every ticket and training command through `daedalus api serve` (uvicorn) with a token.

The remote CLI gets an unreachable Temporal address and an empty home, so a command that bypassed the API
(straight to Temporal or the store) would fail instead of passing unnoticed.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from daedalus.ports import free_port
from tests.cli.test_ticket_cli import DAEDALUS, daedalus, wait_for_output, write_spec
from tests.cli.test_training_cli import SEP, status_until
from tests.workflows.test_training import make_spec, trainers


def create_token(env: dict[str, str], person: str) -> str:
    created = daedalus(env, "token", "create", "--person", person)
    assert created.returncode == 0, created.stderr
    [token] = [line for line in created.stdout.splitlines() if line.startswith("dtk_")]
    return token


@pytest.fixture
def api_url(cli_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "api.log").open("wb")
    server = subprocess.Popen(
        [DAEDALUS, "api", "serve", "--port", str(port)], env=cli_env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            assert server.poll() is None, (tmp_path / "api.log").read_text()
            try:
                httpx.get(f"{url}/openapi.json", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the API never started listening"
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def remote(cli_env: dict[str, str], tmp_path: Path, url: str, token: str) -> dict[str, str]:
    return {
        **cli_env,
        "DAEDALUS_API_URL": url,
        "DAEDALUS_API_TOKEN": token,
        "DAEDALUS_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",  # nothing listens: only the API may be used
        "DAEDALUS_HOME": str(tmp_path / "laptop"),
    }


def test_file_and_decide_through_the_api_as_the_tokens_person(
    cli_env: dict[str, str], workers: str, api_url: str, tmp_path: Path
) -> None:
    wayne = create_token(cli_env, "wayne")
    mallory = create_token(cli_env, "mallory")
    with sqlite3.connect(Path(cli_env["DAEDALUS_HOME"]) / "daedalus.db") as db:
        stored = repr(db.execute("SELECT * FROM api_tokens").fetchall())
    for token in (wayne, mallory):
        assert token not in stored and token.split("_", 2)[2] not in stored
    as_wayne = remote(cli_env, tmp_path, api_url, wayne)
    as_mallory = remote(cli_env, tmp_path, api_url, mallory)

    ticket_id = f"api{os.getpid()}{int(time.time()) % 10000}"
    spec = str(write_spec(tmp_path, workers, ticket_id))
    posing = daedalus(as_mallory, "ticket", "create", "-f", spec, "--as", "wayne")
    assert posing.returncode == 2
    assert "--as wayne does not match your API token, which belongs to mallory" in posing.stderr
    filed = daedalus(as_mallory, "ticket", "create", "-f", spec)
    assert filed.returncode == 0, filed.stderr
    assert f"filed ticket {ticket_id}" in filed.stdout and "by mallory" in filed.stdout

    shown = wait_for_output(as_wayne, ["ticket", "show", ticket_id], "waiting for a decision")
    request_id = f"{ticket_id}-dispatch-1"
    assert request_id in shown
    posing = daedalus(as_wayne, "decide", request_id, "approve", "--as", "mallory")
    assert posing.returncode == 2
    assert "--as mallory does not match your API token, which belongs to wayne" in posing.stderr
    not_a_decider = daedalus(as_mallory, "decide", request_id, "approve")
    assert not_a_decider.returncode == 2 and "mallory may not decide dispatch" in not_a_decider.stderr
    approved = daedalus(as_wayne, "decide", request_id, "approve", "--as", "wayne", "--note", "looks right")
    assert approved.returncode == 0, approved.stderr
    wait_for_output(as_wayne, ["ticket", "show", ticket_id], "[passed]")

    audit = daedalus(as_wayne, "audit", "--ticket", ticket_id)
    assert audit.returncode == 0, audit.stderr
    assert "mallory" in audit.stdout and "wayne chose 'approve'" in audit.stdout
    assert "closed passed" in audit.stdout
    listed = daedalus(as_mallory, "ticket", "list", "--status", "passed")
    assert ticket_id in listed.stdout

    # Revoked at once, with a message that says what happened; the other person's token still works.
    token_id = wayne.split("_")[1]
    listed = daedalus(cli_env, "token", "list", "--person", "wayne").stdout
    assert token_id in listed and mallory.split("_")[1] not in listed and wayne not in listed
    assert daedalus(cli_env, "token", "revoke", token_id).returncode == 0
    refused = daedalus(as_wayne, "ticket", "list")
    assert refused.returncode == 2
    assert "refused your token (DAEDALUS_API_TOKEN): this token was revoked" in refused.stderr
    assert daedalus(as_mallory, "ticket", "list").returncode == 0


def test_shared_stack_settings_that_cannot_work_are_refused_clearly(
    cli_env: dict[str, str], api_url: str, tmp_path: Path
) -> None:
    no_token = remote(cli_env, tmp_path, api_url, "")
    del no_token["DAEDALUS_API_TOKEN"]
    answer = daedalus(no_token, "ticket", "list")
    assert answer.returncode == 2 and "DAEDALUS_API_TOKEN is not set" in answer.stderr
    forged = daedalus(remote(cli_env, tmp_path, api_url, "dtk_00000000_" + "x" * 43), "audit")
    assert (
        forged.returncode == 2
        and "refused your token (DAEDALUS_API_TOKEN): unknown bearer token" in forged.stderr
    )
    nobody = remote(cli_env, tmp_path, f"http://127.0.0.1:{free_port()}", "dtk_00000000_" + "x" * 43)
    answer = daedalus(nobody, "ticket", "show", "t1")
    assert answer.returncode == 2 and "cannot reach the Daedalus API at http://127.0.0.1:" in answer.stderr


def test_the_local_stack_trusts_the_local_user_but_wants_a_name(cli_env: dict[str, str]) -> None:
    answer = daedalus(cli_env, "decide", "t1-dispatch-1", "approve")
    assert answer.returncode == 2 and "say who acts with --as <person>" in answer.stderr
    old_map = {**cli_env, "DAEDALUS_API_TOKENS": '{"s3cret": "wayne"}'}
    answer = daedalus(old_map, "ticket", "list")
    assert answer.returncode == 2 and "daedalus token create --person <person>" in answer.stderr


def test_train_start_status_stop_through_the_api_as_the_tokens_person(
    cli_env: dict[str, str], workers: str, api_url: str, tmp_path: Path
) -> None:
    as_wayne = remote(cli_env, tmp_path, api_url, create_token(cli_env, "wayne"))
    spec = make_spec(tmp_path, "--step-s", "0.05", host=workers)
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    try:
        posing = daedalus(as_wayne, "train", "start", "-f", str(run_file), "--as", "mallory")
        assert posing.returncode == 2 and "belongs to wayne" in posing.stderr
        started = daedalus(as_wayne, "train", "start", "-f", str(run_file))
        assert started.returncode == 0, started.stderr
        assert f"started training-{spec.name} on host {workers} as wayne" in started.stdout
        running = status_until(as_wayne, spec.name, rf"trainer pid{SEP}\d+")
        assert re.search(rf"state{SEP}running", running)
        stopped = daedalus(as_wayne, "train", "stop", spec.name, "--reason", "api test")
        assert stopped.returncode == 0, stopped.stderr
        status_until(as_wayne, spec.name, rf"state{SEP}stopped")
        audit = daedalus(as_wayne, "audit", "--ticket", spec.workflow_id)
        assert "stopped by wayne: api test" in " ".join(audit.stdout.split())
        assert "started incarnation 1" in audit.stdout and "wayne" in audit.stdout
    finally:
        for trainer in trainers(spec):
            trainer.kill()


def test_questions_through_the_api_as_the_tokens_person(
    cli_env: dict[str, str], workers: str, api_url: str, tmp_path: Path, task_queue: str
) -> None:
    as_lead = remote(cli_env, tmp_path, api_url, create_token(cli_env, "lead"))
    examples = Path(__file__).resolve().parents[2] / "examples" / "questions"
    data = yaml.safe_load((examples / "forbid-fp8.yaml").read_text())
    question_id = f"{data['id']}-{task_queue[-8:]}"
    asked = tmp_path / "q.yaml"
    asked.write_text(yaml.safe_dump({**data, "id": question_id, "deciders": ["wayne"]}))
    posing = daedalus(as_lead, "question", "ask", "-f", str(asked), "--as", "wayne")
    assert posing.returncode == 2 and "belongs to lead" in posing.stderr
    done = daedalus(as_lead, "question", "ask", "-f", str(asked))
    assert done.returncode == 0, done.stderr
    assert f"asked question {question_id} of wayne" in " ".join(done.stdout.split())

    deadline = time.monotonic() + 60
    while (
        f"{question_id}-question-1"
        not in (listed := daedalus(as_lead, "question", "list", "--pending")).stdout
    ):
        assert time.monotonic() < deadline, listed.stdout + listed.stderr
        time.sleep(0.5)
    assert "[open: rule|decline]" in listed.stdout
    shown = daedalus(as_lead, "question", "show", question_id)
    assert "status: open" in shown.stdout and "options: rule, decline" in shown.stdout, shown.stderr

    withdrawn = daedalus(as_lead, "question", "withdraw", question_id, "--reason", "asked in error")
    assert withdrawn.returncode == 0, withdrawn.stderr
    assert f"question {question_id} withdrawn by lead" in withdrawn.stdout
    while "status: open" in (shown := daedalus(as_lead, "question", "show", question_id)).stdout:
        assert time.monotonic() < deadline, shown.stdout + shown.stderr
        time.sleep(0.5)
    assert "no questions waiting" in daedalus(as_lead, "question", "list", "--pending").stdout
    assert "no standing rulings" in daedalus(as_lead, "rulings").stdout
