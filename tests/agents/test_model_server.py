"""The local model server speaks the two streaming wire protocols exactly: every event it sends validates against
the `anthropic` and `openai` SDKs' own event models, and the SDKs' streaming clients assemble its answers."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from daedalus.agents.model_server import (
    EditFile,
    ModelScript,
    ModelServer,
    ReadFile,
    Reply,
    Shell,
    Step,
    WriteFile,
    tool_call,
)

CLAUDE_TOOLS = [{"name": n, "input_schema": {"type": "object"}} for n in ("Bash", "Read", "Edit", "Write")]
CODEX_TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]


def events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in response.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_anthropic_stream_events_are_the_sdks_own(model_server: ModelServer) -> None:
    model_server.add("wire-a", ModelScript.of(Shell("ls"), Reply("done")))
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 10,
        "stream": True,
        "tools": CLAUDE_TOOLS,
        "messages": [],
    }
    response = httpx.post(f"{model_server.url}/v1/messages", json=body, headers={"x-api-key": "wire-a"})
    assert response.headers["content-type"].startswith("text/event-stream")
    seen = events(response)
    for name, data in seen:
        assert name == data["type"]
        if name != "ping":
            adapter.validate_python(data)
    names = [name for name, _ in seen]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert ("content_block_delta", "input_json_delta") in {
        (n, d.get("delta", {}).get("type")) for n, d in seen
    }


def test_responses_stream_events_are_the_sdks_own_with_sequence_numbers(model_server: ModelServer) -> None:
    model_server.add("wire-o", ModelScript.of(Shell("ls"), Reply("done")))
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    body = {"model": "gpt-5-codex", "stream": True, "tools": CODEX_TOOLS, "input": []}
    response = httpx.post(
        f"{model_server.url}/v1/responses", json=body, headers={"authorization": "Bearer wire-o"}
    )
    seen = events(response)
    for name, data in seen:
        assert name == data["type"]
        adapter.validate_python(data)
    assert [d["sequence_number"] for _, d in seen] == list(range(len(seen)))
    names = [name for name, _ in seen]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in names


async def test_the_sdks_assemble_its_tool_calls_text_and_usage(model_server: ModelServer) -> None:
    script = model_server.add(
        "wire-sdk", ModelScript.of(Step(Shell("make -j2"), input_tokens=321, output_tokens=12), Reply("ok"))
    )
    claude = anthropic.AsyncAnthropic(api_key="wire-sdk", base_url=model_server.url, max_retries=0)
    async with claude.messages.stream(
        model="claude-sonnet-4-5",
        max_tokens=64,
        messages=[{"role": "user", "content": "go"}],
        tools=CLAUDE_TOOLS,  # type: ignore[arg-type]
    ) as stream:
        message = await stream.get_final_message()
    [block] = message.content
    assert (
        block.type == "tool_use"
        and block.name == "Bash"
        and block.input
        == {
            "command": "make -j2",
            "description": "Run a command",
        }
    )
    assert (message.usage.input_tokens, message.usage.output_tokens) == (321, 12)
    assert message.stop_reason == "tool_use"
    codex = openai.AsyncOpenAI(api_key="wire-sdk", base_url=f"{model_server.url}/v1", max_retries=0)
    reply = None
    async with codex.responses.stream(
        model="gpt-5-codex",
        input=[{"type": "function_call_output", "call_id": "c1", "output": "built"}],
        tools=CODEX_TOOLS,  # type: ignore[arg-type]
    ) as stream_o:
        reply = await stream_o.get_final_response()
    assert reply.output_text == "ok" and reply.usage is not None and reply.usage.input_tokens > 0
    assert script.tool_results == ["built"]
    assert [u.input_tokens for u in script.usage][:1] == [321]


async def test_an_unknown_key_and_a_scripted_error_get_each_providers_error_body(
    model_server: ModelServer,
) -> None:
    claude = anthropic.AsyncAnthropic(api_key="nobody", base_url=model_server.url, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError, match="no script for that API key"):
        await claude.messages.create(
            model="m",
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            tools=CLAUDE_TOOLS,  # type: ignore[arg-type]
        )
    model_server.add("wire-err", ModelScript.of(Step(Reply(""), status=429)))
    codex = openai.AsyncOpenAI(api_key="wire-err", base_url=f"{model_server.url}/v1", max_retries=0)
    with pytest.raises(openai.RateLimitError, match="scripted error 429"):
        await codex.responses.create(model="m", input="x", tools=CODEX_TOOLS)  # type: ignore[arg-type]


def test_the_step_is_the_number_of_tool_results_so_a_retried_request_gets_the_same_answer(
    model_server: ModelServer,
) -> None:
    script = model_server.add("wire-steps", ModelScript.of(Shell("a"), Shell("b"), Reply("c")))

    def ask(results: int) -> str:
        history = [
            {"type": "function_call_output", "call_id": str(i), "output": f"out {i}"} for i in range(results)
        ]
        body = {"model": "m", "tools": CODEX_TOOLS, "input": history}
        answer = httpx.post(
            f"{model_server.url}/v1/responses", json=body, headers={"authorization": "Bearer wire-steps"}
        )
        item = answer.json()["output"][0]
        return str(
            json.loads(item["arguments"])["cmd"]
            if item["type"] == "function_call"
            else item["content"][0]["text"]
        )

    assert [ask(0), ask(0), ask(1), ask(2), ask(3)] == ["a", "a", "b", "c", script.exhausted]
    assert script.tool_results == ["out 0", "out 1", "out 2"]


def test_a_side_request_without_the_agents_tools_is_answered_outside_the_script(
    model_server: ModelServer,
) -> None:
    script = model_server.add("wire-side", ModelScript.of(Shell("a")))
    body = {"model": "claude-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "title?"}]}
    answer = httpx.post(
        f"{model_server.url}/v1/messages", json=body, headers={"x-api-key": "wire-side"}
    ).json()
    assert answer["content"] == [{"type": "text", "text": "ok"}]
    assert script.requests == 0 and len(script.usage) == 1


@pytest.mark.parametrize(
    ("action", "claude", "codex"),
    [
        (Shell("make"), ("Bash", "command", "make"), "make"),
        (ReadFile("a.txt"), ("Read", "file_path", "/w/a.txt"), "cat 'a.txt'"),
        (
            WriteFile("a.txt", "x\n"),
            ("Write", "file_path", "/w/a.txt"),
            "cat > 'a.txt' <<'DAEDALUS_EOF'\nx\nDAEDALUS_EOF",
        ),
        (
            EditFile("a.txt", "1", "2"),
            ("Edit", "file_path", "/w/a.txt"),
            "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: a.txt\n@@\n-1\n+2\n*** End Patch\nEOF",
        ),
    ],
)
def test_each_action_is_the_tool_call_each_cli_offers(
    action: Shell | ReadFile | WriteFile | EditFile, claude: tuple[str, str, str], codex: str
) -> None:
    call = tool_call(action, "anthropic", {"Bash", "Read", "Write", "Edit"}, "/w")
    assert call is not None and (call.name, claude[1], call.arguments[claude[1]]) == claude
    call = tool_call(action, "responses", {"exec_command"}, "/w")
    assert call is not None and call.name == "exec_command" and call.arguments == {"cmd": codex}
    older = tool_call(action, "responses", {"shell"}, "/w")
    assert older is not None and older.arguments == {"command": ["bash", "-lc", codex]}
