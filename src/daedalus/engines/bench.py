"""The benchmark client: streaming OpenAI-compatible completions, rounds, A/B interleaving, validity checks.

Definitions (MEASUREMENT.md): TTFT = first streamed chunk with content; TPOT = (E2E - TTFT) / (tokens - 1);
decode tok/s per request = 1000 / TPOT client-side, or the server's own `timings.predicted_per_second`,
which is preferred when present and cross-checked against the client's (> 3% apart is flagged).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import httpx
import structlog
from rich.progress import Progress

from daedalus.engines.base import Server
from daedalus.engines.metrics import counter
from daedalus.engines.tiny_model import _WORDS
from daedalus.errors import ServerDied
from daedalus.gates.statistics import summarize
from daedalus.schemas.engines import (
    BenchResult,
    ConcurrencyResult,
    RequestSample,
    RoundResult,
    Summary,
    Workload,
)

log = structlog.get_logger(__name__)
DISAGREEMENT_FLAG = 0.03

ProgressFn = Callable[[int, int, str], None]


def make_prompt(words: int, *, seed: int, round_no: int, user: int, side: str) -> str:
    """A fresh prompt per (round, user, side), so no round is a prefix-cache hit of another."""
    rng = random.Random(f"{seed}:{round_no}:{user}:{side}")
    return " ".join(rng.choice(_WORDS) for _ in range(words))


async def _sse_events(response: httpx.Response) -> AsyncIterator[dict[str, object]]:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)


async def stream_completion(
    client: httpx.AsyncClient,
    base_url: str,
    *,
    model: str,
    prompt: str,
    max_tokens: int,
    seed: int,
    user: int,
    extra: dict[str, object],
) -> RequestSample:
    """One streamed /v1/completions request at temperature 0 with ignore_eos, timed from the client."""
    body: dict[str, object] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        **extra,
    }
    start = time.perf_counter()
    first: float | None = None
    chunks = 0
    text: list[str] = []
    usage_tokens: int | None = None
    timings: dict[str, float] = {}
    try:
        async with client.stream("POST", base_url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:300]
                return RequestSample(user=user, ok=False, error=f"HTTP {response.status_code}: {detail}")
            async for event in _sse_events(response):
                choices = event.get("choices") or []
                if isinstance(choices, list) and choices:
                    piece = choices[0].get("text") or ""
                    if piece:
                        chunks += 1
                        text.append(piece)
                        if first is None:
                            first = time.perf_counter()
                usage = event.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    usage_tokens = int(usage["completion_tokens"])
                raw_timings = event.get("timings")
                if isinstance(raw_timings, dict):
                    timings = {k: float(v) for k, v in raw_timings.items() if isinstance(v, int | float)}
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return RequestSample(user=user, ok=False, error=f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    tokens = usage_tokens if usage_tokens is not None else int(timings.get("predicted_n", 0))
    e2e_ms = (end - start) * 1000
    ttft_ms = (first - start) * 1000 if first is not None else None
    tpot_ms = (e2e_ms - ttft_ms) / (tokens - 1) if ttft_ms is not None and tokens > 1 else None
    prompt_ms = timings.get("prompt_ms")
    prompt_n = timings.get("prompt_n")
    return RequestSample(
        user=user,
        ok=first is not None,
        error=None if first is not None else "no content chunk was streamed",
        ttft_ms=ttft_ms,
        e2e_ms=e2e_ms,
        tpot_ms=tpot_ms,
        completion_tokens=tokens,
        content_chunks=chunks,
        client_decode_tps=1000.0 / tpot_ms if tpot_ms else None,
        server_decode_tps=timings.get("predicted_per_second"),
        server_prompt_ms=prompt_ms,
        server_prompt_tps=(prompt_n / prompt_ms * 1000) if prompt_ms and prompt_n else None,
        server_predicted_n=int(timings["predicted_n"]) if "predicted_n" in timings else None,
        text="".join(text),
    )


@dataclass
class Side:
    """One side of a benchmark (the candidate, or the A/B baseline) on its own launched server."""

    name: str
    server: Server
    model_name: str = "default"
    rounds: list[RoundResult] = field(default_factory=list)
    peak_deferred: float = 0.0
    cached_before: float = 0.0
    preempted_before: float = 0.0


def request_extras(side: Side) -> dict[str, object]:
    # llama.cpp reuses a common prompt prefix (even the BOS token) unless told not to; a benchmark must not.
    from daedalus.engines.llama_cpp import LlamaCppAdapter

    return {"cache_prompt": False} if isinstance(side.server.adapter, LlamaCppAdapter) else {}


async def run_round(
    client: httpx.AsyncClient, side: Side, workload: Workload, users: int, round_no: int, warmup: bool
) -> RoundResult:
    side.server.check_alive()
    started = time.perf_counter()
    requests = await asyncio.gather(
        *(
            stream_completion(
                client,
                side.server.base_url,
                model=side.model_name,
                prompt=make_prompt(
                    workload.prompt_words, seed=workload.seed, round_no=round_no, user=u, side=side.name
                ),
                max_tokens=workload.max_tokens,
                seed=workload.seed,
                user=u,
                extra=request_extras(side),
            )
            for u in range(users)
        )
    )
    wall = time.perf_counter() - started
    return RoundResult(
        round=round_no, users=users, preset=side.name, warmup=warmup, wall_s=wall, requests=list(requests)
    )


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def concurrency_result(side: Side, users: int) -> ConcurrencyResult:
    """Per measured round: the median over its requests; server timings preferred."""
    rounds = [r for r in side.rounds if r.users == users and not r.warmup and r.ok]
    server, client, ttft, tpot, aggregate, gaps = [], [], [], [], [], []
    for r in rounds:
        s = _median([q.server_decode_tps for q in r.requests])
        c = _median([q.client_decode_tps for q in r.requests])
        if s is not None:
            server.append(s)
        if c is not None:
            client.append(c)
        if s and c:
            gaps.append(abs(c / s - 1))
        ttft.append(_median([q.ttft_ms for q in r.requests]) or 0.0)
        tpot.append(_median([q.tpot_ms for q in r.requests]) or 0.0)
        aggregate.append(sum(q.completion_tokens for q in r.requests) / r.wall_s)
    use_server = len(server) == len(rounds) and bool(rounds)
    decode = server if use_server else client
    summary = None
    if decode:
        stats = summarize(decode)
        summary = Summary(
            n=stats.n, median=stats.median, ci_low=stats.ci_low, ci_high=stats.ci_high, cv=stats.cv
        )
    return ConcurrencyResult(
        users=users,
        preset=side.name,
        decode_tps=decode,
        client_decode_tps=client,
        ttft_ms=ttft,
        tpot_ms=tpot,
        aggregate_tps=aggregate,
        decode_summary=summary,
        server_client_disagreement=statistics.median(gaps) if gaps else None,
        timing_source="server" if use_server else "client",
    )


async def _watch_deferred(sides: Sequence[Side], stop: asyncio.Event) -> None:
    """llama.cpp has no preemption; a request deferred for want of a slot is the equivalent failure."""
    while not stop.is_set():
        for side in sides:
            with contextlib.suppress(httpx.HTTPError):
                values = await side.server.metrics()
                side.peak_deferred = max(side.peak_deferred, values.get("llamacpp:requests_deferred", 0.0))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


async def _counters(side: Side) -> tuple[float, float]:
    values = await side.server.metrics()
    cached = counter(values, "llamacpp:prompt_tokens_cached_total") + counter(
        values, "vllm:prefix_cache_hits_total"
    )
    return cached, counter(values, "vllm:num_preemptions_total")


async def benchmark(
    candidate: Side,
    workload: Workload,
    *,
    run_id: str,
    model: str,
    baseline: Side | None = None,
    on_progress: ProgressFn | None = None,
    show_progress: bool | None = None,
) -> BenchResult:
    """Warm up, then run measured rounds for each concurrency; with a baseline, interleave A B A B.

    A server that dies, a failed request or a wrong token count makes the result INVALID (never a low number).
    """
    sides = [candidate] if baseline is None else [candidate, baseline]
    invalid: list[str] = []
    for side in sides:
        slots = getattr(side.server.adapter.preset, "parallel", None)
        # More users than llama.cpp slots means queued (deferred) requests, however briefly: not "N at once".
        if slots is not None and max(workload.users) > slots:
            invalid.append(
                f"{side.name}: {max(workload.users)} users but {slots} slots; requests would be deferred"
            )
    per_side = (workload.warmup_rounds + workload.rounds) * len(workload.users)
    total = per_side * len(sides)
    done = 0
    show = sys.stderr.isatty() if show_progress is None else show_progress
    stop = asyncio.Event()
    watcher: asyncio.Task[None] | None = None
    limits = httpx.Limits(max_connections=max(workload.users) * 2 + 4)
    timeout = httpx.Timeout(workload.request_timeout_s, connect=10.0)
    with Progress(disable=not show, transient=True) as bar:
        task = bar.add_task(f"bench {candidate.name}", total=total)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            try:
                for side in sides:
                    side.cached_before, side.preempted_before = await _counters(side)
                for users in workload.users:
                    for round_no in range(workload.warmup_rounds + workload.rounds):
                        warmup = round_no < workload.warmup_rounds
                        if not warmup and watcher is None:
                            watcher = asyncio.create_task(_watch_deferred(sides, stop))
                        # Alternate which side goes first so neither always runs on a warmer machine.
                        order = sides if round_no % 2 == 0 else list(reversed(sides))
                        for side in order:
                            side.rounds.append(
                                await run_round(client, side, workload, users, round_no, warmup)
                            )
                            done += 1
                            bar.update(task, completed=done)
                            if on_progress is not None:
                                on_progress(done, total, f"{side.name} users={users} round={round_no}")
            except (ServerDied, httpx.HTTPError) as exc:
                invalid.append(f"the run broke: {exc}")
            finally:
                stop.set()
                if watcher is not None:
                    await watcher
    for side in sides:
        if side.server.process.returncode() is not None:
            code = side.server.process.returncode()
            reason = f"{side.name}: the server died (exit code {code}); log kept at {side.server.log_path}"
            if not any(reason in r for r in invalid):
                invalid.append(reason)
    failed = mismatched = 0
    for side in sides:
        for r in side.rounds:
            if r.warmup:
                continue
            failed += sum(not q.ok for q in r.requests)
            mismatched += sum(q.ok and q.completion_tokens != workload.max_tokens for q in r.requests)
    if failed:
        first_error = next(q.error for s in sides for r in s.rounds for q in r.requests if not q.ok)
        invalid.append(f"{failed} failed requests (first: {first_error})")
    if mismatched:
        invalid.append(f"{mismatched} completions without exactly {workload.max_tokens} tokens (ignore_eos)")
    preemptions = cached = 0
    alive = [s for s in sides if s.server.process.returncode() is None]
    for side in alive:
        with contextlib.suppress(httpx.HTTPError):
            cached_after, preempted_after = await _counters(side)
            cached += int(cached_after - side.cached_before)
            preemptions += int(preempted_after - side.preempted_before)
        preemptions += int(side.peak_deferred)
    if preemptions:
        invalid.append(f"{preemptions} preempted or deferred requests; the claim is all users served at once")
    if cached:
        invalid.append(f"{cached} prompt tokens served from the prefix cache; rounds must not be cache hits")
    results = [concurrency_result(candidate, u) for u in workload.users]
    baseline_results = [concurrency_result(baseline, u) for u in workload.users] if baseline else []
    flags = [
        f"{r.preset} users={r.users}: client and server decode tok/s disagree by "
        f"{r.server_client_disagreement:.1%} (> 3%)"
        for r in results + baseline_results
        if r.server_client_disagreement is not None and r.server_client_disagreement > DISAGREEMENT_FLAG
    ]
    return BenchResult(
        run_id=run_id,
        preset=candidate.name,
        baseline_preset=baseline.name if baseline else None,
        model=model,
        workload=workload,
        results=results,
        baseline_results=baseline_results,
        failed_requests=failed,
        token_count_mismatches=mismatched,
        preemptions=preemptions,
        prefix_cache_hits=cached,
        invalid_reasons=invalid,
        flags=flags,
        server_log=str(candidate.server.log_path),
        rounds=[r for side in sides for r in side.rounds],
    )
