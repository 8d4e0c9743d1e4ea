"""The API app under a real uvicorn server on 127.0.0.1, in a thread, for the browser to visit."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.api import create_app
from daedalus.api.settings import ApiSettings
from daedalus.ports import free_port
from daedalus.slack.settings import SlackSettings
from daedalus.store import tokens as api_tokens


async def _no_temporal() -> Client:
    raise RuntimeError("these pages never need Temporal")


@contextmanager
def serving(engine: Engine, tokens: dict[str, str]) -> Iterator[str]:
    """The API over `engine`, which is given `tokens` (token -> person) first."""
    for token, person in tokens.items():
        api_tokens.add(engine, person, token, created_by="tests")
    app = create_app(
        engine=engine, control_queue="unused", client_factory=_no_temporal,
        settings=ApiSettings(), slack=SlackSettings(bot_token=None, channel=None),
    )  # fmt: skip
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(f"{base}/openapi.json", timeout=2)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn never started listening") from None
            time.sleep(0.1)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)
