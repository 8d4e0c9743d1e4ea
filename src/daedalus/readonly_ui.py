"""The Temporal UI the embedded stack serves, read-only: every change to a ticket goes through Daedalus.

The dev server's embedded UI has no switch for read-only (`temporal server start-dev --help` offers only
`--ui-ip`, `--ui-port`, `--ui-disable-news-fetch`, `--headless`), and its write routes (cancel, terminate,
signal, update, reset, batch operations, schedules, starting workflows) act as nobody: "cancelled by
temporal", with no person and no reason, past Daedalus's policy. So the UI listens on an internal port and
this proxy serves it on the public one:

* reads pass: pages, assets, every GET of the UI's API, and workflow queries (a POST that changes nothing);
* every other request is refused with 403 and where to do it instead (`daedalus ticket cancel ...`);
* the UI's own settings (`/api/v1/settings`) are answered with its write actions disabled, so its pages do not
  offer buttons that would only be refused;
* its pages carry the Daedalus defaults (`ui_defaults.py`): the workflow list's columns show each ticket's title,
  status, who it waits for and its outcome, and the saved views of the README are there, without any set-up in
  the browser. UI 2.54 keeps both in the browser's local storage and has no server setting for either, so the page
  sets them before the UI starts: the columns only where the browser has none of its own for that namespace, the
  views (ids `daedalus-*`) afresh on every page, so that "failed this week" always means the last seven days.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from daedalus.errors import DevServerError
from daedalus.ports import port_in_use
from daedalus.ui_defaults import with_defaults

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
QUERY_ROUTE = re.compile(r"^/api/v1/namespaces/[^/]+/workflows/[^/]+/query/[^/]+$")
"""QueryWorkflow in Temporal's HTTP API: a query handler cannot change its workflow."""
SETTINGS_ROUTE = "/api/v1/settings"
WRITE_SWITCHES = (
    "DisableWriteActions",
    "WorkflowTerminateDisabled",
    "WorkflowCancelDisabled",
    "WorkflowSignalDisabled",
    "WorkflowUpdateDisabled",
    "WorkflowResetDisabled",
    "WorkflowPauseDisabled",
    "BatchActionsDisabled",
    "StartWorkflowDisabled",
    "ActivityCommandsDisabled",
)
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip
REFUSAL = (
    "this Temporal UI is read-only: changes to tickets, training runs and campaigns go through Daedalus, "
    "which records who made them and why (daedalus ticket cancel ID --as YOU --reason ..., daedalus decide ..., "
    "or the API)"
)


def is_read(method: str, path: str) -> bool:
    """Whether a request to the UI only reads."""
    return method in READ_METHODS or (method == "POST" and QUERY_ROUTE.match(path) is not None)


def read_only_settings(body: bytes) -> bytes:
    """The UI's settings with every write action switched off."""
    settings = json.loads(body)
    settings.update(dict.fromkeys(WRITE_SWITCHES, True))
    return json.dumps(settings).encode()


def read_only_ui(upstream: str) -> Starlette:
    """An ASGI app serving the UI at `upstream` (e.g. http://127.0.0.1:41234), read-only."""
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(30.0, connect=5.0))
    origin = upstream.rstrip("/")

    async def proxy(request: Request) -> Response:
        response: Response
        path = request.url.path
        if not is_read(request.method, path):
            return JSONResponse({"message": REFUSAL, "code": 7}, status_code=403)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if "origin" in headers:  # the UI server checks a POST's origin against its own
            headers["origin"] = origin
        page = request.method == "GET" and "text/html" in request.headers.get("accept", "")
        if page:  # read whole and given the defaults: asked for uncompressed
            headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
            headers["accept-encoding"] = "identity"
        outgoing = client.build_request(
            request.method, path, params=request.url.query, headers=headers, content=await request.body()
        )
        answer = await client.send(outgoing, stream=True)
        kept = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in answer.headers.multi_items()  # two Set-Cookie headers stay two
            if name.lower() not in HOP_BY_HOP | {"date", "server"}
        ]
        html = answer.headers.get("content-type", "").startswith("text/html")
        if page and html and answer.status_code == 200 and "content-encoding" not in answer.headers:
            body = with_defaults(await answer.aread())
            await answer.aclose()
            response = Response(body, status_code=200)
        elif path == SETTINGS_ROUTE and answer.status_code == 200:
            body = read_only_settings(await answer.aread())  # decoded: its content-encoding no longer holds
            await answer.aclose()
            response = Response(body, status_code=200)
            kept = [(name, value) for name, value in kept if name.lower() != b"content-encoding"]
        else:
            response = StreamingResponse(
                answer.aiter_raw(), status_code=answer.status_code, background=BackgroundTask(answer.aclose)
            )
        response.raw_headers = [(n, v) for n, v in response.raw_headers if n == b"content-length"] + kept
        return response

    methods = ["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"]

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with client:
            yield

    return Starlette(routes=[Route("/{path:path}", proxy, methods=methods)], lifespan=lifespan)


class _ServerWithoutSignals(uvicorn.Server):
    """The stack handles SIGINT/SIGTERM itself (cli/stack.py) and stops this server with the rest."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ReadOnlyUi:
    """The proxy as a uvicorn server on `port` (loopback), run as a task of the stack's event loop."""

    def __init__(self, upstream_port: int, port: int) -> None:
        config = uvicorn.Config(
            read_only_ui(f"http://127.0.0.1:{upstream_port}"),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
        )
        self.server = _ServerWithoutSignals(config)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        port = self.server.config.port
        if port_in_use(port):
            raise DevServerError(
                f"port {port} (the Temporal UI) is already in use: another `daedalus up`? Stop it, or set "
                f"DAEDALUS_TEMPORAL_UI_PORT"
            )
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():  # uvicorn logs why and exits
                raise DevServerError(f"the Temporal UI proxy could not listen on port {port}")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self.task is not None:
            self.server.should_exit = True
            await self.task
