"""A local Slack: the Web API's chat.postMessage and interaction response_urls, over real HTTP.

It checks what real Slack checks for the calls Daedalus makes (bearer token, known channel, text or blocks,
action_ids unique within a block) and answers in Slack's wire format: HTTP 200 with `{"ok": false, "error": ...}`
for a refusal, 429 with Retry-After for a rate limit.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs


@dataclass
class FakeSlack:
    token: str = "xoxb-fake-bot-token"
    channels: tuple[str, ...] = ("C0DECISIONS",)
    posts: list[dict[str, Any]] = field(default_factory=list)
    """Accepted chat.postMessage calls, as Slack stored them (with their ts)."""
    refused: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    responses: list[dict[str, Any]] = field(default_factory=list)
    """JSON bodies posted to response_urls, each with `_path`."""
    rate_limit_next: int = 0
    port: int = 0
    _seq: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def response_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/actions/{name}"

    def post_message(self, authorization: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if self.rate_limit_next > 0:
                self.rate_limit_next -= 1
                return 429, {"ok": False, "error": "ratelimited"}
            error = self._check(authorization, body)
            if error:
                self.refused.append((error, body))
                return 200, {"ok": False, "error": error}
            self._seq += 1
            ts = f"{int(time.time())}.{self._seq:06d}"
            message = {**body, "ts": ts}
            self.posts.append(message)
            return 200, {"ok": True, "channel": body["channel"], "ts": ts, "message": message}

    def _check(self, authorization: str, body: dict[str, Any]) -> str | None:
        if not authorization.startswith("Bearer "):
            return "not_authed"
        if authorization.removeprefix("Bearer ") != self.token:
            return "invalid_auth"
        if body.get("channel") not in self.channels:
            return "channel_not_found"
        blocks = body.get("blocks") or []
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
        if not body.get("text") and not blocks:
            return "no_text"
        for block in blocks:
            ids = [e.get("action_id") for e in block.get("elements", []) if "action_id" in e]
            if len(ids) != len(set(ids)):
                return "invalid_blocks"
            for element in block.get("elements", []):
                if element.get("type") == "button" and len(element.get("value", "")) > 2000:
                    return "invalid_blocks"
        return None


def _handler(slack: FakeSlack) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            if self.headers.get("Content-Type", "").startswith("application/json"):
                body = json.loads(raw or "{}")
            else:
                body = {k: v[0] for k, v in parse_qs(raw).items()}
            if self.path == "/api/chat.postMessage":
                code, answer = slack.post_message(self.headers.get("Authorization", ""), body)
            elif self.path.startswith("/api/"):
                code, answer = 200, {"ok": False, "error": "unknown_method"}
            elif self.path.startswith("/actions/"):
                with slack._lock:
                    slack.responses.append({**body, "_path": self.path})
                code, answer = 200, {"ok": True}
            else:
                code, answer = 404, {"ok": False, "error": "not_found"}
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            if code == 429:
                self.send_header("Retry-After", "1")
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextmanager
def running_fake_slack(**options: Any) -> Iterator[FakeSlack]:
    slack = FakeSlack(**options)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(slack))
    slack.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield slack
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
