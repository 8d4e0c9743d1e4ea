"""The Temporal UI the stack serves is read-only: its pages and queries work, its write routes are refused.

A real dev server with its real UI (2.54) behind the proxy; the requests are the ones the UI itself sends
(its JSON API under /api/v1, its CSRF cookie and header). The workflow is checked on the server afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from daedalus.devserver import DevServer
from daedalus.errors import DevServerError
from daedalus.ports import free_port
from daedalus.readonly_ui import WRITE_SWITCHES, ReadOnlyUi, is_read


@workflow.defn(sandboxed=False)
class Parked:
    def __init__(self) -> None:
        self.poked = 0

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: self.poked > 0)
        return self.poked

    @workflow.signal
    def poke(self) -> None:
        self.poked += 1

    @workflow.query
    def pokes(self) -> int:
        return self.poked


class Ui:
    def __init__(self, server: DevServer, proxy: ReadOnlyUi, port: int) -> None:
        self.server, self.proxy = server, proxy
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30)


@pytest.fixture
async def ui() -> AsyncIterator[Ui]:
    server = DevServer(db_file=None, port=free_port(), ui_port=free_port(), die_with_parent=True)
    await asyncio.to_thread(server.start)
    port = free_port()
    proxy = ReadOnlyUi(upstream_port=server.ui_port or 0, port=port)
    await proxy.start()
    served = Ui(server, proxy, port)
    try:
        yield served
    finally:
        await served.http.aclose()
        await proxy.stop()
        await asyncio.to_thread(server.stop)


async def csrf(http: httpx.AsyncClient) -> dict[str, str]:
    """What the UI's own page sends with a POST: its CSRF cookie's value as a header."""
    await http.get("/namespaces/default/workflows")
    token = http.cookies.get("_csrf")
    assert token, "the UI sets its CSRF cookie on a page load"
    return {"X-CSRF-TOKEN": token, "Origin": str(http.base_url).rstrip("/")}


async def test_pages_and_queries_pass_and_every_write_route_is_refused(ui: Ui) -> None:
    client = await Client.connect(ui.server.address)
    queue = f"ui-{uuid.uuid4()}"
    async with Worker(client, task_queue=queue, workflows=[Parked]):
        handle = await client.start_workflow(Parked.run, id=f"parked-{uuid.uuid4()}", task_queue=queue)
        wid = handle.id
        page = await ui.http.get(f"/namespaces/default/workflows/{wid}")
        assert page.status_code == 200 and "<html" in page.text.lower()
        listed = await ui.http.get(
            "/api/v1/namespaces/default/workflows", params={"query": f"WorkflowId='{wid}'"}
        )
        assert listed.status_code == 200 and wid in listed.text, listed.text

        settings = (await ui.http.get("/api/v1/settings")).json()
        assert all(settings[switch] is True for switch in WRITE_SWITCHES)
        assert settings["DisableNewsFetch"] is True

        headers = await csrf(ui.http)
        query = await ui.http.post(
            f"/api/v1/namespaces/default/workflows/{wid}/query/pokes",
            json={"execution": {"workflowId": wid}, "query": {"queryType": "pokes"}},
            headers=headers,
        )
        assert query.status_code == 200, query.text
        (payload,) = query.json()["queryResult"]["payloads"]
        assert base64.b64decode(payload["data"]) == b"0"  # the query's answer: no pokes yet

        base = f"/api/v1/namespaces/default/workflows/{wid}"
        for method, path, body in [
            ("POST", f"{base}/cancel", {"reason": "from the UI"}),
            ("POST", f"{base}/terminate", {"reason": "from the UI"}),
            ("POST", f"{base}/signal/poke", {}),
            ("POST", f"{base}/update/decide", {}),
            ("POST", f"{base}/reset", {}),
            ("POST", "/api/v1/namespaces/default/batch-operations/x", {}),
            ("POST", f"/api/v1/namespaces/default/workflows/started-{uuid.uuid4()}", {}),
            ("DELETE", "/api/v1/namespaces/default/schedules/s", None),
        ]:
            answer = await ui.http.request(method, path, json=body, headers=headers)
            assert answer.status_code == 403, (method, path, answer.status_code)
            assert (
                "read-only" in answer.json()["message"]
                and "daedalus ticket cancel" in answer.json()["message"]
            )

        description = await handle.describe()
        assert description.status is WorkflowExecutionStatus.RUNNING
        assert await handle.query(Parked.pokes) == 0  # the refused signal never arrived
        await handle.signal(Parked.poke)  # through Temporal's client, the workflow still works
        assert await handle.result() == 1


def test_only_reads_and_queries_are_reads() -> None:
    assert is_read("GET", "/api/v1/namespaces/default/workflows/x/cancel")  # a GET changes nothing
    assert is_read("POST", "/api/v1/namespaces/default/workflows/x/query/state")
    assert not is_read("POST", "/api/v1/namespaces/default/workflows/x/query/state/../../terminate")
    assert not is_read("POST", "/api/v1/namespaces/default/workflows/x/cancel")
    assert not is_read("PUT", "/api/v1/namespaces/default/schedules/s")


async def test_a_taken_ui_port_is_refused_with_what_to_set() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proxy = ReadOnlyUi(upstream_port=free_port(), port=taken.getsockname()[1])
        with pytest.raises(DevServerError, match="DAEDALUS_TEMPORAL_UI_PORT"):
            await proxy.start()
