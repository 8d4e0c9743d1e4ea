"""The API app under a real uvicorn server on 127.0.0.1, in a thread, for the browser to visit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.api import create_app
from daedalus.api.settings import ApiSettings
from daedalus.ports import free_port, wait_until_open
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
    wait_until_open(port, "uvicorn", timeout_s=20)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)
