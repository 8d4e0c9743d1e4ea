"""The benchmark client: streaming OpenAI-compatible completions, rounds, A/B interleaving, validity checks.

Every measured round carries the host's load while it ran (gates/contention.py: the CPU other processes took
beside the harness and its servers), so a speed verdict measured on a busy host can say so.

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
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import structlog
from rich.progress import Progress

from daedalus.engines.base import Server
from daedalus.engines.metrics import SpecCounters, counter, segment_means_ms, segment_totals, spec_counters
from daedalus.engines.tiny_model import _WORDS
from daedalus.errors import EngineError
from daedalus.gates.contention import LoadMeter
from daedalus.gates.statistics import summarize
from daedalus.schemas.engines import (
    BenchResult,
    ConcurrencyResult,
    LlamaCppPreset,
    RoundResult,
    Summary,
    VllmPreset,
    Workload,
)

PREEMPTED_REASON = "preempted or deferred requests; the claim is all users served at once"
"""A run's invalid reason when requests were preempted: the claim of every gate but a preemptions gate."""

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
    role: str = "candidate"
    """candidate, or baseline in an A/B: how its rounds' host load is labelled."""
    rounds: list[RoundResult] = field(default_factory=list)
    peak_deferred: float = 0.0
    cached_before: float = 0.0
    preempted_before: float = 0.0
    cached: int = 0
    preempted: int = 0


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


def _may_defer(side: Side, users: int) -> bool:
    """Only llama.cpp defers requests, and only with more than one user in flight: a single user's request
    always has its slot. Polling where nothing can be deferred costs the measuring client CPU per token
    (at 60 tok/s, a 0.5 s poll was a quarter of it)."""
    return isinstance(side.server.adapter.preset, LlamaCppPreset) and users > 1


async def _watch_deferred(sides: Sequence[Side], stop: asyncio.Event) -> None:
    """llama.cpp has no preemption; a request deferred for want of a slot is the equivalent failure.
    `requests_deferred` is a gauge, so it is polled while requests are in flight."""
    while not stop.is_set():
        for side in sides:
            with contextlib.suppress(EngineError):
                values = await side.server.metrics()
                side.peak_deferred = max(side.peak_deferred, values.get("llamacpp:requests_deferred", 0.0))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


def _speculates(side: Side) -> bool:
    preset = side.server.adapter.preset
    if isinstance(preset, LlamaCppPreset):
        return preset.draft is not None
    return preset.speculative is not None


async def _spec(side: Side) -> SpecCounters | None:
    """The side's speculative-decoding counters (None when it does not speculate, or /metrics is unreadable)."""
    if not _speculates(side):
        return None
    try:
        return spec_counters(await asyncio.to_thread(side.server.metrics_text))
    except EngineError:
        return None


def _with_acceptance(
    result: RoundResult, before: SpecCounters | None, after: SpecCounters | None
) -> RoundResult:
    """A round's acceptance length and per-position acceptance, from the counters' deltas over the round."""
    if before is None or after is None:
        return result
    delta = after.since(before)
    if delta.acceptance_length is None:
        return result
    positions = range(1, max(delta.accepted_per_position, default=-1) + 2)
    return result.model_copy(update={
        "acceptance_length": delta.acceptance_length,
        "position_acceptance": [delta.position_acceptance(k) or 0.0 for k in positions],
    })  # fmt: skip


async def _counters(side: Side) -> tuple[float, float]:
    values = await side.server.metrics()
    cached = counter(values, "llamacpp:prompt_tokens_cached_total") + counter(
        values, "vllm:prefix_cache_hits_total"
    )
    return cached, counter(values, "vllm:num_preemptions_total")


def _slot_problems(side: Side, workload: Workload) -> list[str]:
    slots = getattr(side.server.adapter.preset, "parallel", None)
    # More users than llama.cpp slots means queued (deferred) requests, however briefly: not "N at once".
    if slots is not None and max(workload.users) > slots:
        return [f"{side.name}: {max(workload.users)} users but {slots} slots; requests would be deferred"]
    return []


async def _measure_round(
    side: Side, workload: Workload, users: int, round_no: int, warmup: bool, pool: Executor
) -> float:
    """Run one round on `side` and keep it, with the host's load around a measured one; returns the client CPU it
    cost when measured (0 for a warm-up)."""
    spec_before = await _spec(side)
    segments_before = await _segments(side)
    meter = None if warmup else LoadMeter()
    load_before = meter.snapshot() if meter else None
    cpu_before = time.process_time()
    measured = await run_round(side, workload, users, round_no, warmup, pool)
    cpu = time.process_time() - cpu_before if not warmup else 0.0
    if meter is not None and load_before is not None:
        load = meter.load(load_before, meter.snapshot(), round_no=round_no, side=side.role)
        measured = measured.model_copy(update={"host_load": load})
    segments_after = await _segments(side)
    if segments_before is not None and segments_after is not None:
        measured = measured.model_copy(
            update={"segments_ms": segment_means_ms(segments_before, segments_after)}
        )
    side.rounds.append(_with_acceptance(measured, spec_before, await _spec(side)))
    return cpu


async def _segments(side: Side) -> dict[str, tuple[float, float]] | None:
    """vLLM's request-time histograms (None for llama.cpp, whose per-request timings are in its responses)."""
    if not isinstance(side.server.adapter.preset, VllmPreset):
        return None
    try:
        return segment_totals(await asyncio.to_thread(side.server.metrics_text))
    except EngineError:
        return None


async def _settle(side: Side, invalid: list[str]) -> None:
    """At the end of a residency: record a death, and add the counters' deltas since it started."""
    code = side.server.process.returncode()
    failed = any(not q.ok for r in side.rounds for q in r.requests)
    if code is None and failed:
        # Requests failed: if the server is dying, say so rather than only "failed requests".
        code = await asyncio.to_thread(side.server.process.exit_code_within, 2.0)
    reason = None
    if code is not None:
        reason = f"{side.name}: the server died (exit code {code}); log kept at {side.server.log_path}"
    elif failed and not await side.server.healthy():
        # vLLM's API process outlives its engine core by seconds on a busy host; its /health answers 503.
        reason = (f"{side.name}: the server died (its engine stopped: health check fails while the process "
                  f"winds down); log kept at {side.server.log_path}")  # fmt: skip
    if reason is not None:
        if not any(reason in r for r in invalid):
            invalid.append(reason)
        return
    with contextlib.suppress(EngineError):
        cached_after, preempted_after = await _counters(side)
        side.cached += int(cached_after - side.cached_before)
        side.preempted += int(preempted_after - side.preempted_before)
    side.preempted += int(side.peak_deferred)
    side.peak_deferred = 0.0


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
    """Both sides resident at once: warm up, then measured rounds for each concurrency, interleaved A B B A.

    Use it for an A/B only where the preset says both fit (see `benchmark_alternating` otherwise). A server
    that dies, a failed request or a wrong token count makes the result INVALID (never a low number).
    """
    if baseline is not None:
        baseline.role = "baseline"
    sides = [candidate] if baseline is None else [candidate, baseline]
    invalid = [problem for side in sides for problem in _slot_problems(side, workload)]
    total = (workload.warmup_rounds + workload.rounds) * len(workload.users) * len(sides)
    done = 0
    show = sys.stderr.isatty() if show_progress is None else show_progress
    stop = asyncio.Event()
    watcher: asyncio.Task[None] | None = None
    client_cpu_s = (
        0.0  # this process's CPU during measured rounds: request threads, event loop, /metrics watcher
    )
    with Progress(disable=not show, transient=True) as bar:
        task = bar.add_task(f"bench {candidate.name}", total=total)
        with ThreadPoolExecutor(max_workers=max(workload.users), thread_name_prefix="bench-user") as pool:
            try:
                for side in sides:
                    side.cached_before, side.preempted_before = await _counters(side)
                for users in workload.users:
                    for round_no in range(workload.warmup_rounds + workload.rounds):
                        warmup = round_no < workload.warmup_rounds
                        if not warmup and watcher is None and any(_may_defer(s, users) for s in sides):
                            watcher = asyncio.create_task(_watch_deferred(sides, stop))
                        # Alternate which side goes first so neither always runs on a warmer machine.
                        order = sides if round_no % 2 == 0 else list(reversed(sides))
                        for side in order:
                            client_cpu_s += await _measure_round(
                                side, workload, users, round_no, warmup, pool
                            )
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
        await _settle(side, invalid)
    return _result(
        candidate, baseline, workload, invalid, run_id=run_id, model=model, client_cpu_s=client_cpu_s
    )


Launch = Callable[[], AbstractAsyncContextManager[Server]]


async def benchmark_alternating(
    candidate: tuple[str, Launch],
    baseline: tuple[str, Launch],
    workload: Workload,
    *,
    run_id: str,
    model: str,
    on_progress: ProgressFn | None = None,
) -> BenchResult:
    """An A/B where the two sides cannot be resident together (one set of GPUs, each side at 0.9 of it).

    Per measured round and concurrency: start one side, run its warm-up rounds (discarded), measure one round,
    stop it; then the other side the same way; the order flips every round (A B, B A, ...). Round i of each
    side is the pair. Every start gets its own warm-up, because a fresh server is a cold one.
    """
    sides: dict[str, Side] = {}
    invalid: list[str] = []
    client_cpu_s = 0.0
    total = workload.rounds * len(workload.users) * 2
    done = 0
    with ThreadPoolExecutor(max_workers=max(workload.users), thread_name_prefix="bench-user") as pool:
        try:
            for users in workload.users:
                for measured_no in range(workload.rounds):
                    order = [candidate, baseline] if measured_no % 2 == 0 else [baseline, candidate]
                    for name, launch in order:
                        async with launch() as server:
                            role = "candidate" if name == candidate[0] else "baseline"
                            side = sides.setdefault(name, Side(name=name, server=server, role=role))
                            side.server = server
                            invalid += [p for p in _slot_problems(side, workload) if p not in invalid]
                            side.cached_before, side.preempted_before = await _counters(side)
                            for warm in range(workload.warmup_rounds):
                                # Warm-up rounds are numbered past the measured ones: fresh prompts, no cache hit.
                                warm_no = workload.rounds + measured_no * workload.warmup_rounds + warm
                                await _measure_round(side, workload, users, warm_no, True, pool)
                            stop = asyncio.Event()
                            may_defer = _may_defer(side, users)
                            watcher = (
                                asyncio.create_task(_watch_deferred([side], stop)) if may_defer else None
                            )
                            try:
                                client_cpu_s += await _measure_round(
                                    side, workload, users, measured_no, False, pool
                                )
                            finally:
                                stop.set()
                                if watcher is not None:
                                    await watcher
                            await _settle(side, invalid)
                        done += 1
                        if on_progress is not None:
                            on_progress(
                                done, total, f"{name} users={users} round={measured_no} (alternating)"
                            )
        except EngineError as exc:
            invalid.append(f"the run broke: {exc}")
    if candidate[0] not in sides or baseline[0] not in sides:
        invalid.append("a side never started")
        raise EngineError("; ".join(invalid))
    result = _result(sides[candidate[0]], sides[baseline[0]], workload, invalid, run_id=run_id, model=model,
                     client_cpu_s=client_cpu_s)  # fmt: skip
    return result.model_copy(update={"residency": "alternating"})


def _result(
    candidate: Side, baseline: Side | None, workload: Workload, invalid: list[str], *, run_id: str, model: str,
    client_cpu_s: float,
) -> BenchResult:  # fmt: skip
    sides = [candidate] if baseline is None else [candidate, baseline]
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
    preemptions = sum(side.preempted for side in sides)
    cached = sum(side.cached for side in sides)
    if preemptions:
        invalid.append(f"{preemptions} {PREEMPTED_REASON}")
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
        client_cpu_s=client_cpu_s,
        rounds=[r for side in sides for r in side.rounds],
    )
