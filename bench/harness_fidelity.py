"""Harness fidelity on the CPU llama.cpp server: is Daedalus's decode tok/s the engine's decode tok/s?

Compares the client's decode tok/s with the server's own `timings.predicted_per_second` (goal: median ratio
within 1%) and with `llama-bench` tg on the same model and threads; CV over 7 rounds with the drop-first
method against naive single runs; and the client's own CPU cost per token.
Writes bench/results/harness_fidelity.json.
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import subprocess
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

MODEL = "medium"
N_GEN = 128
ROUNDS = 7
NAIVE_RUNS = 7
OUT = Path(__file__).parent / "results" / "harness_fidelity.json"


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0


async def main() -> dict[str, float]:
    build = await ensure_build()
    model = ensure_model(MODEL)
    preset = load_preset("local-f16")
    assert isinstance(preset, LlamaCppPreset)
    threads = preset.threads or 2
    workload = Workload(users=[1], rounds=ROUNDS, warmup_rounds=1, max_tokens=N_GEN, prompt_words=16)
    workdir = Path("/tmp/daedalus-harness-fidelity")
    async with launched(preset, model, workdir, build=build) as server:
        before = resource.getrusage(resource.RUSAGE_SELF)
        result = await benchmark(
            Side(preset.name, server), workload, run_id="harness-fidelity", model=str(model)
        )
        after = resource.getrusage(resource.RUSAGE_SELF)
        # Naive: a fresh single request each time, no warm-up, every run counted.
        naive: list[float] = []
        for i in range(NAIVE_RUNS):
            one = await benchmark(
                Side(preset.name, server),
                Workload(users=[1], rounds=1, warmup_rounds=0, max_tokens=N_GEN, prompt_words=16, seed=100 + i),
                run_id=f"naive-{i}", model=str(model), show_progress=False,
            )  # fmt: skip
            naive += one.results[0].client_decode_tps
    if not result.valid:
        raise SystemExit(f"benchmark INVALID: {result.invalid_reasons}")
    r = result.results[0]
    measured = [q for rnd in result.rounds if not rnd.warmup for q in rnd.requests]
    ratios = [
        q.client_decode_tps / q.server_decode_tps
        for q in measured
        if q.client_decode_tps and q.server_decode_tps
    ]
    tokens = sum(q.completion_tokens for rnd in result.rounds for q in rnd.requests)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = subprocess.run(
        [str(build.binary("llama-bench")), "-m", str(model), "-p", "0", "-n", str(N_GEN), "-t", str(threads),
         "-r", "5", "-o", "json"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    llama_bench_tps = float(json.loads(out.stdout)[0]["avg_ts"])
    figures = {
        "server_timings_ratio_median": statistics.median(ratios),
        "daedalus_decode_tps_median": statistics.median(r.client_decode_tps),
        "server_decode_tps_median": statistics.median(r.decode_tps),
        "llama_bench_tg_tps": llama_bench_tps,
        "llama_bench_ratio": statistics.median(r.decode_tps) / llama_bench_tps,
        "cv_drop_first": cv(r.decode_tps),
        "cv_naive": cv(naive),
        "client_cpu_us_per_token": cpu_s / tokens * 1e6,
    }
    table = Table(
        title=f"harness fidelity: {MODEL} model, {N_GEN} tokens, {ROUNDS} rounds, {threads} threads"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        table.add_row(key, f"{value:.4f}")
    Console().print(table)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


if __name__ == "__main__":
    paths.configure(
        Settings.load().engines
    )  # the engine cache, from DAEDALUS_ENGINES_CACHE_DIR / DAEDALUS_CACHE_DIR
    asyncio.run(main())
