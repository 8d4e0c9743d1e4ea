"""One log format: what a command logs to stderr (piped, so JSON lines) parses line by line, whatever logged it.

Real commands against failing servers: a worker whose Temporal server goes away (Temporal core's retry warnings,
which it used to write to stdout in its own colours), and `ticket list` against an API that answers with the
wrong shape (an unexpected exception, which used to be a traceback box between the JSON lines).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from daedalus.devserver import DevServer
from daedalus.ports import free_port
from tests.cli.test_ticket_cli import DAEDALUS


def records(stderr: str) -> list[dict[str, Any]]:
    """Every stderr line as a log record; a line that is not one fails the test, naming it."""
    found = []
    for line in stderr.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"a stderr line is not a JSON log record: {line!r}\n--- stderr:\n{stderr}")
        assert isinstance(record, dict) and {"event", "level", "timestamp"} <= record.keys(), line
        found.append(record)
    return found


def environment(tmp_path: Path, **values: str) -> dict[str, str]:
    base = {key: value for key, value in os.environ.items() if not key.startswith("DAEDALUS_API")}
    return {**base, "DAEDALUS_HOME": str(tmp_path / "home"), **values}


def test_a_worker_whose_server_goes_away_logs_temporal_core_in_the_one_format(tmp_path: Path) -> None:
    server = DevServer(None, port=free_port(), ui_port=None).start()
    env = environment(tmp_path, DAEDALUS_TEMPORAL_ADDRESS=server.address)
    worker = subprocess.Popen(
        [DAEDALUS, "worker", "--control"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(worker.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any("workers started" in line for line in lines):
            assert worker.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        server.stop()  # the workers' polls now fail, and Temporal's core retries them, warning each time
        deadline = time.monotonic() + 90
        while not any("temporalio.core" in line for line in lines):
            assert worker.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.5)
    finally:
        server.stop()
        os.killpg(worker.pid, signal.SIGINT)
        stdout, _ = worker.communicate(timeout=60)
        reader.join(timeout=10)
    found = records("".join(lines))
    core = [record for record in found if record.get("logger") == "temporalio.core"]
    assert core and all(record["level"] == "warning" for record in core)
    assert all(record["target"] and "sdk_core" not in record["event"] for record in core)  # fields, not text
    assert "WARN" not in stdout and "retried" not in stdout  # core no longer writes its own lines to stdout


class WrongShape(BaseHTTPRequestHandler):
    """An API that answers every request with JSON of a shape no Daedalus API gives."""

    def do_GET(self) -> None:
        body = json.dumps([{"not": "a ticket"}]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def wrong_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), WrongShape)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_an_unexpected_failure_is_one_record_with_the_exception_as_fields(
    tmp_path: Path, wrong_api: str
) -> None:
    env = environment(tmp_path, DAEDALUS_API_URL=wrong_api, DAEDALUS_API_TOKEN="t0ken")
    done = subprocess.run([DAEDALUS, "ticket", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "│" not in done.stderr  # no traceback text, no rich box
    (failure,) = records(done.stderr)
    assert failure["event"] == "command failed" and failure["level"] == "error"
    assert failure["command"] == "ticket" and failure["error"].startswith("ValidationError: ")
    (exception,) = failure["exception"]
    assert exception["exc_type"] == "ValidationError" and "ticket_id" in exception["exc_value"]
    assert any(frame["filename"].endswith("cli/tickets.py") for frame in exception["frames"])


def test_an_api_that_does_not_answer_json_is_an_error_that_says_so(tmp_path: Path) -> None:
    port = free_port()
    with subprocess.Popen(
        ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ) as server:  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            env = environment(
                tmp_path, DAEDALUS_API_URL=f"http://127.0.0.1:{port}", DAEDALUS_API_TOKEN="t0ken"
            )
            (tmp_path / "tickets").write_text("<html>a web page, not the API</html>")
            while True:
                done = subprocess.run(
                    [DAEDALUS, "ticket", "list"], env=env, capture_output=True, text=True, timeout=60
                )
                if "cannot reach" not in done.stderr or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        finally:
            server.terminate()
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.split())
    assert "answered GET /tickets with something that is not JSON" in said and "DAEDALUS_API_URL" in said
