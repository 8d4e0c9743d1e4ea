"""The benchmark client: streaming OpenAI-compatible completions, rounds, A/B interleaving, validity checks.

Definitions (MEASUREMENT.md): TTFT = first streamed chunk with content; TPOT = (E2E - TTFT) / (tokens - 1);
decode tok/s per request = 1000 / TPOT client-side, or the server's own `timings.predicted_per_second`,
which is preferred when present and cross-checked against the client's (> 3% apart is flagged).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import structlog
from rich.progress import Progress

from daedalus.engines.base import Server
from daedalus.engines.metrics import counter
from daedalus.engines.process import EngineError
from daedalus.engines.tiny_model import _WORDS
from daedalus.gates.statistics import summarize
from daedalus.schemas.engines import (
    BenchResult,
    ConcurrencyResult,
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


@dataclass
class Side:
    """One side of a benchmark (the candidate, or the A/B baseline) on its own launched server."""

    name: str
    server: Server
    rounds: list[RoundResult] = field(default_factory=list)
    peak_deferred: float = 0.0
    cached_before: float = 0.0
    preempted_before: float = 0.0


async def run_round(
    side: Side, workload: Workload, users: int, round_no: int, warmup: bool, executor: Executor | None = None
) -> RoundResult:
    """One round: `users` streamed requests at once, each on its own thread (see engines/openai_api.py)."""
    side.server.check_alive()
    api = side.server.endpoint(workload.request_timeout_s)
    await api.served_model()
    own = executor is None
    pool = executor or ThreadPoolExecutor(max_workers=users, thread_name_prefix="bench-user")
    started = time.perf_counter()
    try:
        requests = await asyncio.gather(
            *(
                api.stream_completion(
                    make_prompt(
                        workload.prompt_words, seed=workload.seed, round_no=round_no, user=u, side=side.name
                    ),
                    max_tokens=workload.max_tokens,
                    seed=workload.seed,
                    user=u,
                    executor=pool,
                )
                for u in range(users)
            )
        )
    finally:
        if own:
            pool.shutdown(wait=False)
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
            with contextlib.suppress(EngineError):
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
    with Progress(disable=not show, transient=True) as bar:
        task = bar.add_task(f"bench {candidate.name}", total=total)
        with ThreadPoolExecutor(max_workers=max(workload.users), thread_name_prefix="bench-user") as pool:
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
                            side.rounds.append(await run_round(side, workload, users, round_no, warmup, pool))
                            done += 1
                            bar.update(task, completed=done)
                            if on_progress is not None:
                                on_progress(done, total, f"{side.name} users={users} round={round_no}")
            except EngineError as exc:
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
        with contextlib.suppress(EngineError):
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
