"""Anthropic Messages API tool loop (the `anthropic` SDK), streamed."""

from __future__ import annotations

from typing import Any

import anthropic

from daedalus.agents.costs import CostMeter
from daedalus.agents.toolloop import SYSTEM, ToolLoop, ToolLoopAgent
from daedalus.agents.tools import anthropic_tools
from daedalus.errors import AgentConfigError, ApiFailure
from daedalus.schemas.agents import AgentTask


def api_failure(error: anthropic.AnthropicError, *, model: str, where: str) -> ApiFailure:
    if isinstance(error, anthropic.APITimeoutError):
        return ApiFailure(f"{where} did not answer in time (after retries): {error}", timed_out=True)
    if isinstance(error, anthropic.NotFoundError):
        return ApiFailure(
            f"model {model!r} is not served at {where} (404): {error.message}; "
            "set agent.model in the spec to a model the API knows"
        )
    if isinstance(error, anthropic.AuthenticationError):
        return ApiFailure(f"{where} rejected the API key (401): {error.message}; check the configured key")
    if isinstance(error, anthropic.RateLimitError):
        return ApiFailure(f"{where} kept rate-limiting (429) after the SDK's retries: {error.message}")
    if isinstance(error, anthropic.APIStatusError):
        return ApiFailure(f"{where} answered {error.status_code}: {error.message}")
    if isinstance(error, anthropic.APIConnectionError):
        return ApiFailure(f"cannot reach {where}: {error}")
    return ApiFailure(f"{where}: {error}")


class AnthropicAgent(ToolLoopAgent):
    name = "anthropic"
    label = "anthropic (Anthropic Messages API tool loop)"

    def model(self, task: AgentTask) -> str:
        return task.agent.model or self.settings.anthropic_model

    def check_config(self, task: AgentTask) -> None:
        if self.settings.anthropic_api_key is None:
            raise AgentConfigError(
                "no Anthropic API key on this worker: set DAEDALUS_AGENT_ANTHROPIC_API_KEY (or ANTHROPIC_API_KEY)"
            )

    def client(self) -> anthropic.AsyncAnthropic:
        assert self.settings.anthropic_api_key is not None
        return anthropic.AsyncAnthropic(
            api_key=self.settings.anthropic_api_key.get_secret_value(),
            base_url=self.settings.anthropic_base_url,
            timeout=self.settings.request_timeout_s,
            max_retries=self.settings.max_retries,
        )

    async def loop(self, task: AgentTask, prompt: str, meter: CostMeter, tools: ToolLoop) -> str | None:
        model = self.model(task)
        where = self.settings.anthropic_base_url or "api.anthropic.com"
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        async with self.client() as client:
            for _ in range(task.max_turns):
                try:
                    async with client.messages.stream(
                        model=model,
                        max_tokens=self.settings.max_tokens,
                        system=SYSTEM,
                        messages=messages,  # type: ignore[arg-type]
                        tools=anthropic_tools(),  # type: ignore[arg-type]
                    ) as stream:
                        message = await stream.get_final_message()
                except anthropic.AnthropicError as error:
                    raise api_failure(error, model=model, where=where) from error
                usage = message.usage
                cached = usage.cache_read_input_tokens or 0
                meter.add(
                    input_tokens=usage.input_tokens + cached + (usage.cache_creation_input_tokens or 0),
                    output_tokens=usage.output_tokens,
                    cached_input_tokens=cached,
                    turns=1,
                    model=message.model,
                )
                content: list[dict[str, Any]] = []
                text: list[str] = []
                uses: list[tuple[str, str, Any]] = []
                for block in message.content:
                    if block.type == "text":
                        content.append({"type": "text", "text": block.text})
                        text.append(block.text)
                    elif block.type == "tool_use":
                        content.append(
                            {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
                        )
                        uses.append((block.id, block.name, block.input))
                tools.transcript.write("assistant", content=content, stop_reason=message.stop_reason)
                messages.append({"role": "assistant", "content": content})
                if not uses:
                    return "\n".join(text)
                results = []
                for use_id, name, arguments in uses:
                    output, is_error = await tools.call(
                        name, arguments if isinstance(arguments, dict) else {}
                    )
                    results.append(
                        {
                            "type": "tool_result",
                            "tool_use_id": use_id,
                            "content": output,
                            "is_error": is_error,
                        }
                    )
                messages.append({"role": "user", "content": results})
        return None
