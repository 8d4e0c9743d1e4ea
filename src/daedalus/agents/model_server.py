"""A local model for the `codex` and `claude` agents: a real HTTP server that speaks the Anthropic Messages API
and the OpenAI Responses API (streamed, with tool calls) and answers from a script instead of a network.

The real Claude Code and Codex CLI run against it unchanged (their base URL points here): each request of an
agent's loop gets the next step of its script — a tool call that runs a command, writes, edits or reads a file —
and the last step is the final message. The step is chosen by how many tool results the request carries, so a
CLI that retries a request gets the same answer again. Every answer reports usage, which the CLI prints in its
JSONL and Daedalus adds to the attempt's cost record.

It is the agents' model in the tests and in `daedalus demo --agent codex|claude` when no key is set. Which
script answers is chosen by the API key the CLI sends (one key per agent run), so several runs can share a
server. The wire formats follow the providers' documented streaming events, checked against the `anthropic`
and `openai` SDKs' own event models in tests/agents/test_model_server.py and against what the two CLIs send
(tests/agents/fixtures/).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

Dialect = Literal["anthropic", "responses"]


@dataclass(frozen=True)
class Shell:
    """Run a command in the agent's shell tool (Claude Code's `Bash`, Codex's `exec_command`)."""

    command: str


@dataclass(frozen=True)
class WriteFile:
    """Create or overwrite a file (Claude Code's `Write`; for Codex, a shell here-document)."""

    path: str
    content: str


@dataclass(frozen=True)
class EditFile:
    """Replace `old` by `new` in a file (Claude Code's `Edit`, which wants the file Read first; for Codex an
    `apply_patch`, which Codex applies itself and reports as a file change)."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class ReadFile:
    """Read a file (Claude Code's `Read`; for Codex, `cat`)."""

    path: str


@dataclass(frozen=True)
class Reply:
    """The final message: no tool call, so the CLI ends its turn."""

    text: str


Action = Shell | WriteFile | EditFile | ReadFile | Reply


@dataclass(frozen=True)
class Step:
    """One answer of the script: an action, and how the answer is delivered."""

    action: Action
    input_tokens: int | None = None
    """Reported input tokens; None: estimated from the request's size (4 bytes a token)."""
    output_tokens: int | None = None
    delay_s: float = 0.0
    """Seconds before the answer starts (a slow model)."""
    status: int = 200
    """An HTTP error status instead of an answer (the provider's error body)."""


@dataclass(frozen=True)
class Usage:
    """What one answer reported."""

    input_tokens: int
    output_tokens: int


@dataclass
class ModelScript:
    """The steps one agent run is answered with, and what the run sent back (its tool results, in order)."""

    steps: list[Step]
    exhausted: str = "The script has no more steps.\nRESULT: failure"
    tool_results: list[str] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)
    requests: int = 0
    first_request: dict[str, Any] | None = None
    """The body of the first request of the agent's loop (its system prompt, tools and the task's prompt)."""

    @classmethod
    def of(cls, *actions: Action | Step) -> ModelScript:
        return cls([a if isinstance(a, Step) else Step(a) for a in actions])

    def step(self, index: int) -> Step:
        return self.steps[index] if index < len(self.steps) else Step(Reply(self.exhausted))

    def totals(self) -> Usage:
        return Usage(sum(u.input_tokens for u in self.usage), sum(u.output_tokens for u in self.usage))


@dataclass(frozen=True)
class Arrival:
    """One request as it arrived: when, where, for which script, and the step it was answered with."""

    at: float
    path: str
    key: str | None
    model: str | None
    step: int | None
    """None for a request outside the agent's loop (a CLI's side request) or refused."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


# ---- what each dialect's CLI sends ----------------------------------------------------------------------------


def _anthropic_tool_results(body: dict[str, Any]) -> list[str]:
    results = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                results.append(_text_of(block.get("content")))
    return results


def _responses_tool_results(body: dict[str, Any]) -> list[str]:
    return [
        _text_of(item.get("output"))
        for item in body.get("input") or []
        if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output")
    ]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text_of(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else json.dumps(content)


def _tool_names(body: dict[str, Any]) -> set[str]:
    return {str(tool.get("name")) for tool in body.get("tools") or [] if isinstance(tool, dict)}


CWD_PATTERNS = (
    re.compile(r"Primary working directory: (\S+)"),  # Claude Code's environment reminder
    re.compile(r"<cwd>([^<]+)</cwd>"),  # Codex's environment_context
)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _working_directory(body: dict[str, Any]) -> str | None:
    """Where the CLI works, as its own environment note in the request says (relative paths resolve there)."""
    for text in _strings(body.get("messages") or body.get("input") or []):
        for pattern in CWD_PATTERNS:
            found = pattern.search(text)
            if found:
                return found.group(1)
    return None


def _absolute(path: str, cwd: str | None) -> str:
    if PurePosixPath(path).is_absolute() or cwd is None:
        return path
    return str(PurePosixPath(cwd) / path)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def tool_call(action: Action, dialect: Dialect, tools: set[str], cwd: str | None) -> ToolCall | None:
    """The tool call a CLI of `dialect` makes for `action`, in the tools it offered; None for a Reply."""
    if isinstance(action, Reply):
        return None
    if dialect == "anthropic":
        match action:
            case Shell(command):
                return ToolCall("Bash", {"command": command, "description": "Run a command"})
            case WriteFile(path, content):
                return ToolCall("Write", {"file_path": _absolute(path, cwd), "content": content})
            case EditFile(path, old, new):
                return ToolCall(
                    "Edit", {"file_path": _absolute(path, cwd), "old_string": old, "new_string": new}
                )
            case ReadFile(path):
                return ToolCall("Read", {"file_path": _absolute(path, cwd)})
    match action:
        case Shell(command):
            command = command
        case WriteFile(path, content):
            if content.endswith("\n"):
                command = f"cat > {_quote(path)} <<'DAEDALUS_EOF'\n{content}DAEDALUS_EOF"
            else:
                command = f"printf %s {_quote(content)} > {_quote(path)}"
        case EditFile(path, old, new):
            hunk = "".join(f"-{line}\n" for line in old.splitlines()) + "".join(
                f"+{line}\n" for line in new.splitlines()
            )
            command = (
                f"apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: {path}\n@@\n{hunk}*** End Patch\nEOF"
            )
        case ReadFile(path):
            command = f"cat {_quote(path)}"
    if "exec_command" in tools:
        return ToolCall("exec_command", {"cmd": command})
    # Codex releases before unified exec offered `shell`, an argv.
    return ToolCall("shell", {"command": ["bash", "-lc", command]})


# ---- what the server answers ----------------------------------------------------------------------------------


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def anthropic_message(
    *, model: str, text: str, call: ToolCall | None, usage: Usage
) -> tuple[dict[str, Any], list[bytes]]:
    """A whole Messages API answer, and the same as its streamed events."""
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if call is not None:
        blocks.append(
            {
                "type": "tool_use",
                "id": f"toolu_{uuid.uuid4().hex[:24]}",
                "name": call.name,
                "input": call.arguments,
            }
        )
    stop = "tool_use" if call is not None else "end_turn"
    full_usage = {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    whole = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": full_usage,
    }
    events = [
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    **whole,
                    "content": [],
                    "stop_reason": None,
                    "usage": {**full_usage, "output_tokens": 1},
                },
            },
        ),
        _sse("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _chunks(block["text"], 24)]
        else:
            start = {**block, "input": {}}
            raw = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in _chunks(raw, 48)]
        events.append(
            _sse(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
            )
        )
        events += [
            _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            for delta in deltas
        ]
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": full_usage,
            },
        )
    )
    events.append(_sse("message_stop", {"type": "message_stop"}))
    return whole, events


def responses_answer(
    *, model: str, text: str, call: ToolCall | None, usage: Usage
) -> tuple[dict[str, Any], list[bytes]]:
    """A whole Responses API answer, and the same as its streamed events (each with its sequence number)."""
    response_id = f"resp_{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    items: list[dict[str, Any]] = []
    if text:
        items.append(
            {
                "id": f"msg_{uuid.uuid4().hex[:24]}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
            }
        )
    if call is not None:
        items.append(
            {
                "id": f"fc_{uuid.uuid4().hex[:24]}",
                "type": "function_call",
                "status": "completed",
                "call_id": f"call_{uuid.uuid4().hex[:24]}",
                "name": call.name,
                "arguments": json.dumps(call.arguments),
            }
        )
    base: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": "in_progress",
        "output": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None,
    }
    whole = {
        **base,
        "status": "completed",
        "completed_at": created,
        "output": items,
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": base}),
        ("response.in_progress", {"response": base}),
    ]
    for index, item in enumerate(items):
        if item["type"] == "message":
            part = item["content"][0]
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(
                (
                    "response.output_item.added",
                    {"output_index": index, "item": {**item, "status": "in_progress", "content": []}},
                )
            )
            events.append(("response.content_part.added", {**ids, "part": {**part, "text": ""}}))
            events += [
                ("response.output_text.delta", {**ids, "delta": piece, "logprobs": []})
                for piece in _chunks(part["text"], 24)
            ]
            events.append(("response.output_text.done", {**ids, "text": part["text"], "logprobs": []}))
            events.append(("response.content_part.done", {**ids, "part": part}))
        else:
            ids = {"item_id": item["id"], "output_index": index}
            events.append(
                (
                    "response.output_item.added",
                    {"output_index": index, "item": {**item, "status": "in_progress", "arguments": ""}},
                )
            )
            events += [
                ("response.function_call_arguments.delta", {**ids, "delta": piece})
                for piece in _chunks(item["arguments"], 48)
            ]
            events.append(
                (
                    "response.function_call_arguments.done",
                    {**ids, "arguments": item["arguments"], "name": item["name"]},
                )
            )
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    events.append(("response.completed", {"response": whole}))
    return whole, [
        _sse(kind, {"type": kind, "sequence_number": n, **data}) for n, (kind, data) in enumerate(events)
    ]


def _anthropic_error(status: int, message: str) -> JSONResponse:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


def _openai_error(status: int, message: str) -> JSONResponse:
    code = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}.get(
        status, "server_error"
    )
    kind = "invalid_request_error" if status < 500 and status != 429 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def _key_of(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    bearer = request.headers.get("authorization", "")
    if not key and bearer.lower().startswith("bearer "):
        key = bearer[7:].strip()
    return key or None


class ModelServer:
    """The scripted model on 127.0.0.1, on a thread of this process. `scripts` maps an API key to its script."""

    def __init__(
        self,
        scripts: dict[str, ModelScript] | None = None,
        *,
        host: str = "127.0.0.1",
        tls: tuple[Path, Path] | None = None,
    ):
        """`tls`: (certificate chain, key) to serve HTTPS, as a provider does, for the name `localhost`."""
        self.scripts: dict[str, ModelScript] = dict(scripts or {})
        self.arrivals: list[Arrival] = []
        self.host = host
        self.tls = tls
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.app = self._build_app()

    @property
    def url(self) -> str:
        """The base URL: Anthropic clients take it as is; OpenAI clients take `url + "/v1"`."""
        if self.tls is not None:
            return f"https://localhost:{self.port}"
        return f"http://{self.host}:{self.port}"

    def add(self, key: str, script: ModelScript) -> ModelScript:
        with self._lock:
            self.scripts[key] = script
        return script

    def first_request_after(self, key: str, since: float) -> float | None:
        """When the first request with `key` after `since` arrived (time.time()), if one did."""
        with self._lock:
            times = [a.at for a in self.arrivals if a.key == key and a.at >= since]
        return min(times) if times else None

    def start(self) -> ModelServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            log_level="error",
            lifespan="off",
            timeout_keep_alive=30,
            ssl_certfile=str(self.tls[0]) if self.tls else None,
            ssl_keyfile=str(self.tls[1]) if self.tls else None,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="model-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the local model server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _record(self, request: Request, key: str | None, model: str | None, step: int | None) -> None:
        with self._lock:
            self.arrivals.append(Arrival(time.time(), request.url.path, key, model, step))

    def _build_app(self) -> FastAPI:
        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

        @app.api_route("/api/hello", methods=["GET", "HEAD"])
        async def hello() -> Response:
            # Claude Code's connectivity check against its base URL.
            return Response(status_code=200)

        @app.post("/v1/messages/count_tokens")
        async def count_tokens(request: Request) -> Response:
            body = await request.body()
            return JSONResponse({"input_tokens": max(1, len(body) // 4)})

        @app.post("/v1/messages")
        async def messages(request: Request) -> Response:
            return await self._answer(request, "anthropic")

        @app.post("/v1/responses")
        async def responses(request: Request) -> Response:
            return await self._answer(request, "responses")

        return app

    async def _answer(self, request: Request, dialect: Dialect) -> Response:
        raw = await request.body()
        error = _anthropic_error if dialect == "anthropic" else _openai_error
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            return error(400, "the request body is not JSON")
        key = _key_of(request)
        model = str(body.get("model") or "local-model")
        with self._lock:
            script = self.scripts.get(key or "")
        if script is None:
            self._record(request, key, model, None)
            return error(401, "this local model server has no script for that API key")
        tools = _tool_names(body)
        primary = {"Bash"} if dialect == "anthropic" else {"exec_command", "shell"}
        stream = bool(body.get("stream"))
        if not tools & primary:
            # A CLI's side request (a title, a summary, a quota probe): answered, outside the script.
            self._record(request, key, model, None)
            usage = Usage(max(1, len(raw) // 4), 1)
            with self._lock:
                script.usage.append(usage)
            return self._respond(dialect, model=model, text="ok", call=None, usage=usage, stream=stream)
        results = _anthropic_tool_results(body) if dialect == "anthropic" else _responses_tool_results(body)
        index = len(results)
        step = script.step(index)
        self._record(request, key, model, index)
        with self._lock:
            script.requests += 1
            script.tool_results[: len(results)] = results
            if script.first_request is None:
                script.first_request = body
        if step.delay_s:
            await asyncio.sleep(step.delay_s)
        if step.status != 200:
            return error(step.status, f"scripted error {step.status} at step {index}")
        call = tool_call(step.action, dialect, tools, _working_directory(body))
        text = step.action.text if isinstance(step.action, Reply) else ""
        produced = json.dumps(call.arguments) if call else text
        usage = Usage(
            step.input_tokens if step.input_tokens is not None else max(1, len(raw) // 4),
            step.output_tokens if step.output_tokens is not None else max(1, len(produced) // 4),
        )
        with self._lock:
            script.usage.append(usage)
        return self._respond(dialect, model=model, text=text, call=call, usage=usage, stream=stream)

    @staticmethod
    def _respond(
        dialect: Dialect, *, model: str, text: str, call: ToolCall | None, usage: Usage, stream: bool
    ) -> Response:
        build = anthropic_message if dialect == "anthropic" else responses_answer
        whole, events = build(model=model, text=text, call=call, usage=usage)
        if not stream:
            return JSONResponse(whole)

        async def body() -> AsyncIterator[bytes]:
            for event in events:
                yield event

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
