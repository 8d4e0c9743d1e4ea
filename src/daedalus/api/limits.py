"""A request-size limit that runs before anything else, authentication included.

A body is counted as it arrives and refused with 413 as soon as it passes the limit (at once when its
Content-Length says so), so a 200 MB body with a bad token costs the API at most the limit, not the body.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 1024 * 1024
"""Every body the API takes is far smaller: a ticket spec is at most 384 KiB as JSON (schemas/limits.py)."""


class BodyLimit:
    """ASGI middleware: buffer at most `max_bytes` of a request body, then hand the app exactly that body."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send, f"declares {declared} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, f"is over {size} bytes and counting")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would deliver it

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, what: str) -> None:
        detail = (
            f"request body {what}; the limit is {self.max_bytes} bytes. A ticket spec is at most 384 KiB as "
            f"JSON: put long briefs, patches and data in the repository and reference them"
        )
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
