"""OpenAI-protocol tool loop (the `openai` SDK): api.openai.com or any compatible server (vLLM, llama.cpp)."""

from __future__ import annotations

from typing import Any

import openai

from daedalus.agents.costs import CostMeter
from daedalus.agents.toolloop import SYSTEM, ToolLoop, ToolLoopAgent
from daedalus.agents.tools import openai_tools
from daedalus.errors import AgentConfigError, ApiFailure
from daedalus.schemas.agents import AgentTask


def api_failure(error: openai.OpenAIError, *, model: str, where: str) -> ApiFailure:
    """An SDK error as a message a person can act on."""
    if isinstance(error, openai.APITimeoutError):
        return ApiFailure(f"{where} did not answer in time (after retries): {error}", timed_out=True)
    if isinstance(error, openai.NotFoundError):
        return ApiFailure(
            f"model {model!r} is not served at {where} (404): {error.message}; "
            "set agent.model in the spec to a model the endpoint lists"
        )
    if isinstance(error, openai.AuthenticationError):
        return ApiFailure(f"{where} rejected the API key (401): {error.message}; check the configured key")
    if isinstance(error, openai.RateLimitError):
        return ApiFailure(f"{where} kept rate-limiting (429) after the SDK's retries: {error.message}")
    if isinstance(error, openai.APIStatusError):
        return ApiFailure(f"{where} answered {error.status_code}: {error.message}")
    if isinstance(error, openai.APIConnectionError):
        return ApiFailure(f"cannot reach {where}: {error}")
    return ApiFailure(f"{where}: {error}")


class OpenAIAgent(ToolLoopAgent):
    name = "openai"
    label = "openai (OpenAI-protocol tool loop)"

    def model(self, task: AgentTask) -> str:
        return task.agent.model or self.settings.openai_model

    def priced(self) -> bool:
        if self.settings.openai_priced is not None:
            return self.settings.openai_priced
        base = self.settings.openai_base_url
        return base is None or "api.openai.com" in base

    def check_config(self, task: AgentTask) -> None:
        if self.settings.openai_api_key is None:
            raise AgentConfigError(
                "no OpenAI API key on this worker: set DAEDALUS_AGENT_OPENAI_API_KEY (or OPENAI_API_KEY); "
                "for a local server that needs none, set any placeholder such as 'local'"
            )

    def client(self) -> openai.AsyncOpenAI:
        assert self.settings.openai_api_key is not None
        return openai.AsyncOpenAI(
            api_key=self.settings.openai_api_key.get_secret_value(),
            base_url=self.settings.openai_base_url,
            timeout=self.settings.request_timeout_s,
            max_retries=self.settings.max_retries,
        )

    async def loop(self, task: AgentTask, prompt: str, meter: CostMeter, tools: ToolLoop) -> str | None:
        model = self.model(task)
        where = self.settings.openai_base_url or "api.openai.com"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": prompt},
        ]
        async with self.client() as client:
            for _ in range(task.max_turns):
                try:
                    text, calls = await self._turn(client, model, messages, meter)
                except openai.OpenAIError as error:
                    raise api_failure(error, model=model, where=where) from error
                tools.transcript.write("assistant", text=text, tool_calls=calls)
                assistant: dict[str, Any] = {"role": "assistant", "content": text or None}
                if calls:
                    assistant["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"] or "{}"},
                        }
                        for c in calls
                    ]
                messages.append(assistant)
                if not calls:
                    return text
                for call in calls:
                    output, _ = await tools.call(call["name"], call["arguments"])
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        return None

    async def _turn(
        self, client: openai.AsyncOpenAI, model: str, messages: list[dict[str, Any]], meter: CostMeter
    ) -> tuple[str, list[dict[str, str]]]:
        """One streamed completion: its text and its tool calls, assembled from the deltas."""
        stream = await client.chat.completions.create(  # type: ignore[call-overload]
            model=model,
            messages=messages,
            tools=openai_tools(),
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=self.settings.max_tokens,
        )
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        usage_seen = False
        async for chunk in stream:
            if chunk.usage is not None and not usage_seen:
                usage_seen = True
                details = chunk.usage.prompt_tokens_details
                meter.add(
                    input_tokens=chunk.usage.prompt_tokens,
                    output_tokens=chunk.usage.completion_tokens,
                    cached_input_tokens=(details.cached_tokens or 0) if details else 0,
                    turns=1,
                    model=chunk.model,
                )
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                for tc in delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    if tc.id:
                        slot["id"] = tc.id
                    if tc.function and tc.function.name:
                        slot["name"] += tc.function.name
                    if tc.function and tc.function.arguments:
                        slot["arguments"] += tc.function.arguments
        if not usage_seen:
            meter.turns += 1
        ordered = [calls[i] for i in sorted(calls)]
        for n, call in enumerate(ordered):
            call["id"] = call["id"] or f"call_{n}"
        return "".join(text), ordered
