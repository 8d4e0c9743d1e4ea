"""Harness fidelity on the CPU llama.cpp server: is Daedalus's decode tok/s the engine's, and what does it cost?

Every figure is labelled with its timing source:
* server_timings_ratio_median — per request, Daedalus's client-timed decode tok/s divided by llama-server's own
  `timings.predicted_per_second` for the same request; the median over the measured requests (goal: within 1%);
* requests_beyond_3pct — how many of those requests' client and server figures differ by more than 3%;
* llama_bench_ratio — the server-timed median decode tok/s over `llama-bench` tg on the same model and threads;
* cv_drop_first / cv_naive — coefficient of variation of server-timed decode tok/s: drop-first is one warm
  server, one discarded round, ROUNDS measured rounds; naive is NAIVE_RUNS cold runs, each a freshly started
  server answering one request, every run counted (the same timing source on both sides);
* client_cpu_us_per_token — this process's CPU (all threads: request threads, event loop, the /metrics
  watcher) during the measured rounds only, divided by the tokens streamed in them: no imports, no statistics,
  no server start-up in the window (goal: <= 150 µs).
Writes bench/results/harness_fidelity.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from daedalus.config import Settings
from daedalus.engines import paths
from daedalus.engines.bench import Side, benchmark
from daedalus.engines.measure import ensure_build
from daedalus.engines.presets import load_preset
from daedalus.engines.runner import launched
from daedalus.engines.tiny_model import ensure_model
from daedalus.schemas.engines import LlamaCppPreset, Workload
from record import Recording

MODEL = os.environ.get("HARNESS_MODEL", "medium")  # "tiny" when the host is too loaded for the medium model
N_GEN = int(os.environ.get("HARNESS_TOKENS", "128"))
ROUNDS = 7
NAIVE_RUNS = 7
OUT = Path(__file__).parent / "results" / "harness_fidelity.json"


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0


async def main() -> dict[str, float]:
    recording = Recording.start()
    build = await ensure_build()
    model = ensure_model(MODEL)
    preset = load_preset("local-f16")
    assert isinstance(preset, LlamaCppPreset)
    threads = preset.threads or 2
    workload = Workload(users=[1], rounds=ROUNDS, warmup_rounds=1, max_tokens=N_GEN, prompt_words=16)
    workdir = Path(tempfile.mkdtemp(prefix="daedalus-harness-fidelity-"))
    async with launched(preset, model, workdir / "warm", build=build) as server:
        result = await benchmark(
            Side(preset.name, server), workload, run_id="harness-fidelity", model=str(model)
        )
    if not result.valid:
        raise SystemExit(f"benchmark INVALID: {result.invalid_reasons}")
    # Naive: a cold server per run, one request, no warm-up, every run counted; server-timed like drop-first.
    naive: list[float] = []
    for i in range(NAIVE_RUNS):
        async with launched(preset, model, workdir / f"naive-{i}", build=build) as server:
            one = await benchmark(
                Side(preset.name, server),
                Workload(users=[1], rounds=1, warmup_rounds=0, max_tokens=N_GEN, prompt_words=16, seed=100 + i),
                run_id=f"naive-{i}", model=str(model), show_progress=False,
            )  # fmt: skip
        naive += one.results[0].decode_tps
    r = result.results[0]
    assert r.timing_source == "server", "llama-server reports its own timings; drop-first must use them"
    measured = [q for rnd in result.rounds if not rnd.warmup for q in rnd.requests]
    ratios = [q.client_decode_tps / q.server_decode_tps for q in measured
              if q.client_decode_tps and q.server_decode_tps]  # fmt: skip
    out = subprocess.run(
        [str(build.binary("llama-bench")), "-m", str(model), "-p", "0", "-n", str(N_GEN), "-t", str(threads),
         "-r", "5", "-o", "json"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    llama_bench_tps = float(json.loads(out.stdout)[0]["avg_ts"])
    cpu = result.client_cpu_us_per_token
    assert cpu is not None
    figures: dict[str, tuple[float, str]] = {
        "server_timings_ratio_median": (
            statistics.median(ratios),
            "client-timed / server-timed decode tok/s, same request; median over measured requests",
        ),
        "requests_beyond_3pct": (
            float(sum(abs(x - 1) > 0.03 for x in ratios)),
            f"measured requests (of {len(ratios)}) whose client and server figures differ by > 3%",
        ),
        "client_decode_tps_median": (
            statistics.median(r.client_decode_tps),
            "client-timed, per-round medians",
        ),
        "server_decode_tps_median": (
            statistics.median(r.decode_tps),
            "server-timed (timings), per-round medians",
        ),
        "llama_bench_tg_tps": (llama_bench_tps, f"llama-bench tg{N_GEN}, {threads} threads, 5 repetitions"),
        "llama_bench_ratio": (
            statistics.median(r.decode_tps) / llama_bench_tps,
            "server-timed median / llama-bench",
        ),
        "cv_drop_first": (
            cv(r.decode_tps),
            f"server-timed, warm server, 1 discarded + {ROUNDS} measured rounds",
        ),
        "cv_naive": (cv(naive), f"server-timed, {NAIVE_RUNS} cold servers, one request each, all counted"),
        "client_cpu_us_per_token": (
            cpu,
            "whole-process CPU during measured rounds / tokens streamed in them",
        ),
    }
    table = Table(
        title=f"harness fidelity: {MODEL} model, {N_GEN} tokens, {ROUNDS} rounds, {threads} threads"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("what it is")
    for key, (value, label) in figures.items():
        table.add_row(key, f"{value:.4f}", label)
    Console(width=180).print(table)
    values = {key: value for key, (value, _) in figures.items()}
    raw = {"drop_first_server_tps": r.decode_tps, "naive_server_tps": naive, "client_over_server": ratios,
           "model": MODEL, "tokens": N_GEN}  # fmt: skip
    labels = {k: label for k, (_, label) in figures.items()}
    recording.write({**values, "labels": labels, "raw": raw}, OUT)
    return values


if __name__ == "__main__":
    paths.configure(
        Settings.load().engines
    )  # the engine cache, from DAEDALUS_ENGINES_CACHE_DIR / DAEDALUS_CACHE_DIR
    asyncio.run(main())
