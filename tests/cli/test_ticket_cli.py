"""The `daedalus` command as a person runs it: real processes, the session's dev server, a SQLite store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from daedalus.devserver import DevServer
from tests.support import SPEED_PATCH, gate_command, make_engine_repo

DAEDALUS = str(Path(sys.executable).parent / "daedalus")


@pytest.fixture
def cli_env(temporal_server: DevServer, tmp_path: Path, task_queue: str) -> dict[str, str]:
    # Filing refuses a host the registry does not declare: declare this test's host (see `workers`).
    hosts_file = tmp_path / "hosts.yaml"
    hosts_file.write_text(yaml.safe_dump({"hosts": [{"name": f"cli-{task_queue[-8:]}"}]}))
    return {
        **os.environ,
        "DAEDALUS_HOSTS_FILE": str(hosts_file),
        "DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address,
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "DAEDALUS_CONTROL_QUEUE": task_queue,
        "COLUMNS": "200",
    }


def daedalus(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DAEDALUS, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def workers(cli_env: dict[str, str], task_queue: str) -> Iterator[str]:
    host = f"cli-{task_queue[-8:]}"
    process = subprocess.Popen(
        [DAEDALUS, "worker", "--control", "--host", host], env=cli_env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    yield host
    os.killpg(process.pid, signal.SIGINT)
    process.wait(30)


def write_spec(tmp_path: Path, host: str, ticket_id: str, **overrides: object) -> Path:
    spec: dict[str, object] = {
        "id": ticket_id,
        "title": "CLI ticket",
        "engine": {"name": "toy", "kind": "llama_cpp", "repo": str(make_engine_repo(tmp_path / "repo"))},
        "host": host,
        "agent": {"name": "scripted", "patch": SPEED_PATCH},
        "gates": [{"name": "decode", "metric": "decode_tps", "threshold": 55, "command": gate_command()}],
        "approval": {"deciders": ["wayne"]},
    }
    spec.update(overrides)
    path = tmp_path / f"{ticket_id}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def wait_for_output(env: dict[str, str], args: list[str], text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out = daedalus(env, *args).stdout
        if text in out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never appeared in `daedalus {' '.join(args)}`:\n{out}")
        time.sleep(0.5)


def test_file_decide_and_audit_from_the_command_line(
    cli_env: dict[str, str], workers: str, tmp_path: Path
) -> None:
    ticket_id = f"cli{os.getpid()}{int(time.time()) % 10000}"
    created = daedalus(cli_env, "ticket", "create", "-f", str(write_spec(tmp_path, workers, ticket_id)))
    assert created.returncode == 0, created.stderr
    again = daedalus(cli_env, "ticket", "create", "-f", str(tmp_path / f"{ticket_id}.yaml"))
    assert again.returncode == 2 and "already live" in again.stderr

    shown = wait_for_output(cli_env, ["ticket", "show", ticket_id], "waiting for a decision")
    request_id = f"{ticket_id}-dispatch-1"
    assert request_id in shown

    refused = daedalus(cli_env, "decide", request_id, "approve", "--as", "mallory")
    assert refused.returncode == 2 and "mallory may not decide dispatch" in refused.stderr
    bad_option = daedalus(cli_env, "decide", request_id, "maybe", "--as", "wayne")
    assert bad_option.returncode == 2 and "unknown option 'maybe'" in bad_option.stderr
    not_a_request = daedalus(cli_env, "decide", "nonsense", "approve", "--as", "wayne")
    assert not_a_request.returncode == 2 and "is not a decision request id" in not_a_request.stderr

    approved = daedalus(cli_env, "decide", request_id, "approve", "--as", "wayne")
    assert approved.returncode == 0, approved.stderr
    wait_for_output(cli_env, ["ticket", "show", ticket_id], "[passed]")

    audit = daedalus(cli_env, "audit", "--ticket", ticket_id)
    assert "wayne chose 'approve'" in audit.stdout and "closed passed" in audit.stdout
    assert "mallory" not in audit.stdout  # the refused decisions wrote nothing
    by_wayne = daedalus(cli_env, "audit", "--actor", "wayne", "--since", "1h")
    assert ticket_id in by_wayne.stdout
    listed = daedalus(cli_env, "ticket", "list")
    assert ticket_id in listed.stdout and "passed" in listed.stdout


def test_bad_spec_file_is_refused_and_starts_nothing(cli_env: dict[str, str], tmp_path: Path) -> None:
    path = write_spec(
        tmp_path, "nohost", "bad1", gates=[{"name": "g", "metric": "joules", "threshold": 1, "command": "x"}]
    )
    refused = daedalus(cli_env, "ticket", "create", "-f", str(path))
    assert refused.returncode == 2
    assert "gates.0.metric" in refused.stderr and "decode_tps" in refused.stderr
    shown = daedalus(cli_env, "ticket", "show", "bad1")
    assert shown.returncode == 2 and "no ticket bad1" in shown.stderr
    missing = daedalus(cli_env, "ticket", "create", "-f", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    since = daedalus(cli_env, "audit", "--since", "yesterday")
    assert since.returncode == 2 and "neither an ISO time" in since.stderr
