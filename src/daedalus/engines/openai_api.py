"""One OpenAI-compatible client path for benchmarks and quality probes, on llama-server and vLLM alike.

* the model name comes from the server's own `/v1/models` (vLLM rejects any name but its `--served-model-name`);
* benchmarks stream `/v1/completions` with `stream_options.include_usage` and `ignore_eos`;
* probes ask `/v1/completions` for temperature-0 completions with the top-2 `logprobs` per token, and read
  either dialect back: vLLM's (`tokens`/`top_logprobs` dicts, ids via `return_tokens_as_token_ids`) or
  llama.cpp's (`logprobs.content[]` with `id` and `top_logprobs[]`).

Why the standard library's http.client, in threads: the client must cost at most 150 µs of CPU per streamed
token (2,000 tok/s on a quarter of a core). Measured by bench/harness_fidelity.py on this machine, a blocking
http.client read loop costs a fraction of httpx's async stack per chunk (httpx ~300 µs/chunk: h11 + anyio
+ an event-loop wake-up per chunk), and needs no new dependency.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from daedalus.errors import ApiError
from daedalus.schemas.engines import GreedyStream, RequestSample


@dataclass
class OpenAIEndpoint:
    """An engine's OpenAI-compatible API: where it is, which model it serves, what each request adds.

    `extra` goes into every request body (llama.cpp: `cache_prompt: false`, so no round is a prefix-cache hit;
    vLLM: `return_tokens_as_token_ids`, so probes compare token ids, not strings).
    """

    base_url: str
    model: str | None = None
    extra: Mapping[str, object] = field(default_factory=dict)
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ApiError(f"{self.base_url!r} is not an http:// URL of an engine server")
        self._host = parts.hostname
        self._port = parts.port or 80

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)

    def _request(self, method: str, path: str, body: Mapping[str, object] | None = None) -> Any:
        conn = self._connection()
        try:
            payload = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError(f"{method} {self.base_url}{path} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        if response.status != 200:
            raise ApiError(
                f"{method} {self.base_url}{path} answered {response.status}: {raw[:300].decode(errors='replace')}"
            )
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ApiError(f"{method} {self.base_url}{path} answered non-JSON: {raw[:200]!r}") from exc

    def served_model_blocking(self) -> str:
        """The served model's name from `/v1/models` (cached): the one name vLLM accepts in requests."""
        if self.model is None:
            listing = self._request("GET", "/v1/models")
            models = [m.get("id") for m in listing.get("data") or [] if isinstance(m, dict)]
            if not models or not isinstance(models[0], str):
                raise ApiError(f"{self.base_url}/v1/models lists no model: {str(listing)[:200]}")
            self.model = models[0]
        return self.model

    async def served_model(self) -> str:
        return await asyncio.to_thread(self.served_model_blocking)

    def prompt_tokens_blocking(self, prompt: str) -> int | None:
        """The prompt's length in the served model's tokens, from vLLM's /tokenize (None where there is none)."""
        try:
            answer = self._request(
                "POST", "/tokenize", {"model": self.served_model_blocking(), "prompt": prompt}
            )
        except ApiError:
            return None
        count = answer.get("count") if isinstance(answer, dict) else None
        return count if isinstance(count, int) else None

    # --- benchmarks -------------------------------------------------------------------------------------

    def stream_blocking(self, prompt: str, *, max_tokens: int, seed: int, user: int) -> RequestSample:
        """One streamed completion at temperature 0 with ignore_eos, timed by this thread's clock.

        Per chunk: one readline, one json.loads and, for a chunk with text, one clock reading; everything else
        waits for the end of the stream.
        """
        body = {
            "model": self.served_model_blocking(),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "seed": seed,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            **self.extra,
        }
        conn = self._connection()
        loads, clock = json.loads, time.perf_counter
        start = clock()
        first: float | None = None
        last = start
        chunks = 0
        text: list[str] = []
        usage_tokens: int | None = None
        timings: dict[str, Any] = {}
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})  # fmt: skip
            response = conn.getresponse()
            if response.status != 200:
                detail = response.read()[:300].decode(errors="replace")
                return RequestSample(user=user, ok=False, error=f"HTTP {response.status}: {detail}")
            readline = response.readline
            while True:
                line = readline()
                if not line:
                    break
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                event = loads(payload)
                choices = event.get("choices")
                if choices:
                    piece = choices[0].get("text")
                    if piece:
                        last = clock()
                        if first is None:
                            first = last
                        chunks += 1
                        text.append(piece)
                usage = event.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    usage_tokens = int(usage["completion_tokens"])
                if "timings" in event:
                    timings = event["timings"]
            end = clock()
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
            return RequestSample(user=user, ok=False, error=f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()
        return _sample(user, start, first, last, end, chunks, "".join(text), usage_tokens, timings)

    async def stream_completion(
        self, prompt: str, *, max_tokens: int, seed: int, user: int, executor: Executor | None = None
    ) -> RequestSample:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            executor, lambda: self.stream_blocking(prompt, max_tokens=max_tokens, seed=seed, user=user)
        )

    # --- quality probes ---------------------------------------------------------------------------------

    def greedy_blocking(self, prompt: str, n_tokens: int) -> GreedyStream:
        """A temperature-0 completion with its token ids and, per position, the gap between the top two
        logprobs (the near-tie rule's evidence)."""
        body = {
            "model": self.served_model_blocking(),
            "prompt": prompt,
            "max_tokens": n_tokens,
            "temperature": 0.0,
            "seed": 0,
            "logprobs": 2,
            "ignore_eos": True,
            **self.extra,
        }
        data = self._request("POST", "/v1/completions", body)
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError) as exc:
            raise ApiError(
                f"{self.base_url}/v1/completions answered without choices: {str(data)[:200]}"
            ) from exc
        return parse_logprobs(str(choice.get("text") or ""), choice.get("logprobs"))

    async def greedy(self, prompt: str, n_tokens: int) -> GreedyStream:
        return await asyncio.to_thread(self.greedy_blocking, prompt, n_tokens)


def _sample(
    user: int, start: float, first: float | None, last: float, end: float, chunks: int, text: str,
    usage_tokens: int | None, timings: Mapping[str, Any],
) -> RequestSample:  # fmt: skip
    """TTFT = first chunk with content; TPOT = (last content chunk - first) / (tokens - 1) (MEASUREMENT.md)."""
    predicted_n = timings.get("predicted_n")
    tokens = usage_tokens if usage_tokens is not None else int(predicted_n or 0)
    ttft_ms = (first - start) * 1000 if first is not None else None
    tpot_ms = (
        (last - first) * 1000 / (tokens - 1) if first is not None and tokens > 1 and last > first else None
    )
    prompt_ms, prompt_n = timings.get("prompt_ms"), timings.get("prompt_n")
    server_tps = timings.get("predicted_per_second")
    return RequestSample(
        user=user,
        ok=first is not None,
        error=None if first is not None else "no content chunk was streamed",
        ttft_ms=ttft_ms,
        e2e_ms=(end - start) * 1000,
        tpot_ms=tpot_ms,
        completion_tokens=tokens,
        content_chunks=chunks,
        client_decode_tps=1000.0 / tpot_ms if tpot_ms else None,
        server_decode_tps=float(server_tps) if server_tps is not None else None,
        server_prompt_ms=float(prompt_ms) if prompt_ms is not None else None,
        server_prompt_tps=(prompt_n / prompt_ms * 1000) if prompt_ms and prompt_n else None,
        server_predicted_n=int(predicted_n) if predicted_n is not None else None,
        text=text,
    )


def _token_id(token: object) -> int:
    # vLLM with return_tokens_as_token_ids prints "token_id:1234"; llama.cpp gives the id itself.
    if isinstance(token, int):
        return token
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token.removeprefix("token_id:"))
    raise ApiError(
        f"the server returned token {token!r} instead of a token id; vLLM needs return_tokens_as_token_ids"
    )


def _gap(logprobs: list[float]) -> float | None:
    top = sorted(logprobs, reverse=True)
    return top[0] - top[1] if len(top) >= 2 else None


def parse_logprobs(text: str, logprobs: object) -> GreedyStream:
    """Token ids and top-2 gaps from either OpenAI-completions logprobs dialect."""
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        steps = logprobs["content"]  # llama.cpp
        ids = [_token_id(step.get("id")) for step in steps]
        gaps = [_gap([float(t["logprob"]) for t in step.get("top_logprobs") or []]) for step in steps]
        return GreedyStream(text=text, token_ids=ids, top2_gaps=gaps)
    if isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list):
        ids = [_token_id(t) for t in logprobs["tokens"]]  # vLLM / OpenAI legacy completions
        tops = logprobs.get("top_logprobs") or []
        gaps = [_gap([float(v) for v in (top or {}).values()]) for top in tops]
        return GreedyStream(text=text, token_ids=ids, top2_gaps=gaps + [None] * (len(ids) - len(gaps)))
    raise ApiError(
        f"the completion carried no per-token logprobs ({str(logprobs)[:120]}); the server must support "
        "`logprobs` on /v1/completions"
    )
