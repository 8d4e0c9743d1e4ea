"""Faithful fakes for the tool-loop agents' tests: OpenAI- (chat completions) and Anthropic-protocol HTTP servers
with scripted turns, and helpers that find a test's processes.

The servers speak the wire protocols the real SDKs expect (JSON and SSE streams, error bodies, 429 with
retry-after), so the real `openai` / `anthropic` clients run against them unchanged. The `codex` and `claude`
agents are tested with the real programs against daedalus.agents.model_server instead (tests/agents/clis.py):
no stand-in for either CLI remains.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

API_KEY = "test-key"


@dataclass
class Turn:
    """One scripted answer: text and/or tool calls with usage, or an HTTP error, or a stall."""

    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    input_tokens: int = 100
    output_tokens: int = 20
    status: int = 200
    error_code: str = ""
    delay_s: float = 0.0
    usage: bool = True


@dataclass
class Script:
    turns: list[Turn] = field(default_factory=list)
    models: set[str] = field(default_factory=lambda: {"gpt-5-codex", "claude-sonnet-4-5", "local-coder"})
    requests: list[dict[str, Any]] = field(default_factory=list)

    def next(self) -> Turn:
        return self.turns.pop(0) if self.turns else Turn(text="nothing left to do\nRESULT: failure")


def _openai_error(status: int, message: str, code: str, kind: str = "invalid_request_error") -> JSONResponse:
    headers = {"retry-after-ms": "20"} if status == 429 else {}
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _anthropic_error(status: int, kind: str, message: str) -> JSONResponse:
    headers = {"retry-after-ms": "20"} if status in (429, 529) else {}
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}}, status_code=status, headers=headers
    )


def build_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        script.requests.append(body)
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return _openai_error(401, "Incorrect API key provided.", "invalid_api_key")
        if body.get("model") not in script.models:
            return _openai_error(
                404,
                f"The model `{body.get('model')}` does not exist or you do not have access to it.",
                "model_not_found",
            )
        turn = script.next()
        if turn.delay_s:
            await asyncio.sleep(turn.delay_s)
        if turn.status != 200:
            return _openai_error(
                turn.status,
                turn.error_code or "error",
                turn.error_code or "error",
                "rate_limit_exceeded" if turn.status == 429 else "server_error",
            )
        cid, model = f"chatcmpl-{uuid.uuid4().hex[:8]}", body["model"]
        calls: list[dict[str, Any]] = [
            {
                "index": i,
                "id": f"call_{uuid.uuid4().hex[:6]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for i, (name, args) in enumerate(turn.tool_calls)
        ]
        usage = {
            "prompt_tokens": turn.input_tokens,
            "completion_tokens": turn.output_tokens,
            "total_tokens": turn.input_tokens + turn.output_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        finish = "tool_calls" if calls else "stop"
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
            if calls:
                message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    **({"usage": usage} if turn.usage else {}),
                }
            )

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
            data = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                **extra,
            }
            return f"data: {json.dumps(data)}\n\n"

        async def events() -> AsyncIterator[str]:
            yield chunk({"role": "assistant", "content": ""})
            for piece in [turn.text[i : i + 7] for i in range(0, len(turn.text), 7)]:
                yield chunk({"content": piece})
            for call in calls:
                args = call["function"]["arguments"]
                head = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
                yield chunk({"tool_calls": [head]})
                for i in range(0, len(args), 5):  # arguments arrive in fragments, as they do for real
                    yield chunk(
                        {"tool_calls": [{"index": call["index"], "function": {"arguments": args[i : i + 5]}}]}
                    )
            yield chunk({}, finish)
            if turn.usage and body.get("stream_options", {}).get("include_usage"):
                data = {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
                yield f"data: {json.dumps(data)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        body = await request.json()
        script.requests.append(body)
        # Older SDKs send x-api-key, newer ones a bearer token: the real API takes both.
        if API_KEY not in (request.headers.get("x-api-key"), request.headers.get("authorization", "")[7:]):
            return _anthropic_error(401, "authentication_error", "invalid x-api-key")
        if body.get("model") not in script.models:
            return _anthropic_error(404, "not_found_error", f"model: {body.get('model')}")
        turn = script.next()
        if turn.delay_s:
            await asyncio.sleep(turn.delay_s)
        if turn.status != 200:
            return _anthropic_error(
                turn.status,
                "rate_limit_error" if turn.status == 429 else "api_error",
                turn.error_code or "error",
            )
        mid, model = f"msg_{uuid.uuid4().hex[:10]}", body["model"]
        blocks: list[dict[str, Any]] = ([{"type": "text", "text": turn.text}] if turn.text else []) + [
            {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:8]}", "name": name, "input": args}
            for name, args in turn.tool_calls
        ]
        stop = "tool_use" if turn.tool_calls else "end_turn"
        usage = {
            "input_tokens": turn.input_tokens,
            "output_tokens": turn.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": blocks,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                }
            )

        def sse(kind: str, data: dict[str, Any]) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

        async def events() -> AsyncIterator[str]:
            yield sse(
                "message_start",
                {
                    "message": {
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {**usage, "output_tokens": 1},
                    }
                },
            )
            for i, block in enumerate(blocks):
                if block["type"] == "text":
                    yield sse(
                        "content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}
                    )
                    for j in range(0, len(block["text"]), 9):
                        yield sse(
                            "content_block_delta",
                            {"index": i, "delta": {"type": "text_delta", "text": block["text"][j : j + 9]}},
                        )
                else:
                    yield sse("content_block_start", {"index": i, "content_block": {**block, "input": {}}})
                    raw = json.dumps(block["input"])
                    for j in range(0, len(raw), 6):
                        yield sse(
                            "content_block_delta",
                            {
                                "index": i,
                                "delta": {"type": "input_json_delta", "partial_json": raw[j : j + 6]},
                            },
                        )
                yield sse("content_block_stop", {"index": i})
            yield sse(
                "message_delta",
                {
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": turn.output_tokens},
                },
            )
            yield sse("message_stop", {})

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve(script: Script) -> Iterator[str]:
    """Run the fake provider on a thread; yields its base URL (append /v1 for OpenAI)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build_app(script), host="127.0.0.1", port=port, log_level="error", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("fake provider did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)


def unique_sleep() -> str:
    """A `sleep` argument no other process on this shared machine uses: finds the fake's child by cmdline,
    since the pid it sees inside its sandbox's pid namespace means nothing outside."""
    return f"300.{uuid.uuid4().int % 10**9:09d}"


def sleeping(seconds: str) -> list[int]:
    """Host pids of live `sleep <seconds>` processes."""
    import psutil

    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if p.info["cmdline"] == ["sleep", seconds] and p.info["status"] != psutil.STATUS_ZOMBIE
    ]
