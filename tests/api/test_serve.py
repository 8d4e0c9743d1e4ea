"""`daedalus api serve` as a real process: uvicorn, a client connected from Settings, the store, OpenAPI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from temporalio.client import Client

from daedalus.devserver import DevServer
from daedalus.ports import free_port
from tests.api.conftest import as_, install_tokens_under
from tests.support import make_engine_repo, ticket_spec


async def test_serve_runs_the_api_under_uvicorn(
    temporal_server: DevServer, temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    port = free_port()
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  - name: h1\n")  # filing refuses a host the registry does not declare
    env = {
        **os.environ,
        "DAEDALUS_HOSTS_FILE": str(hosts),
        "DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address,
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "DAEDALUS_CONTROL_QUEUE": task_queue,
    }
    install_tokens_under(tmp_path / "home")
    command = [sys.executable, "-c", "from daedalus.cli.api import app; app()", "serve", "--port", str(port)]
    server = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as api:
            deadline = time.monotonic() + 30
            while True:
                assert server.poll() is None, server.communicate()[0].decode()
                try:
                    schema = (await api.get("/openapi.json")).json()
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the API never started listening"
                    await asyncio.sleep(0.2)
            assert {"/tickets", "/tickets/{ticket_id}", "/decisions", "/audit", "/slack/interactions"} <= set(
                schema["paths"]
            )
            assert any(name.startswith("TicketSpec") for name in schema["components"]["schemas"])

            spec = ticket_spec(make_engine_repo(tmp_path / "repo"), "h1", approval={"deciders": ["wayne"]})
            filed = await api.post("/tickets", json=spec.model_dump(mode="json"), headers=as_("wayne"))
            assert filed.status_code == 201, filed.text
            handle = temporal_client.get_workflow_handle(filed.json()["workflow_id"])
            description = await handle.describe()
            assert description.task_queue == task_queue
            await handle.terminate("test over")
            assert (await api.get("/tickets", headers=as_("wayne"))).json() == []  # no worker wrote a row
            assert (tmp_path / "home" / "daedalus.db").exists()
    finally:
        server.terminate()
        server.wait(timeout=10)
