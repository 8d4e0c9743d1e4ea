"""The README's benchmark table, made from the runs kept in bench/reference/ — never typed by hand.

Each benchmark writes its figures with the conditions of its run (bench/record.py). The runs the README quotes
are copied to `bench/reference/<name>.json`; this module turns each into the table's rows, and every row says
under which conditions its run was made (cores, load before and during, commit). A figure without its run's
file cannot be in the table.

    .venv/bin/python bench/figures.py           # print the table
    .venv/bin/python bench/figures.py --write   # put it into README.md between the markers

tests/bench/test_readme_figures.py fails when README.md and the reference files disagree, and when a reference
file has no renderer here (or a renderer no file).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "bench" / "reference"
README = ROOT / "README.md"
START = "<!-- bench-figures: made by bench/figures.py from bench/reference/*.json; do not edit by hand -->"
END = "<!-- /bench-figures -->"

Row = tuple[str, str, str]
"""(figure, value, goal)"""
Figures = dict[str, Any]


def provenance(figures: Figures) -> tuple[str | None, str]:
    """(the commit the run was made at, where and how loaded it was): what its figures claim no more than.

    Runs recorded by bench/record.py carry it under `run`; the two made before it (dispatch, vllm_fidelity)
    recorded the same facts in their own keys, read here as they are."""
    if "run" in figures:
        run = figures["run"]
        machine, load = run["machine"], run["load"]
        during = load["during"]
        other = (
            f"{during['other_processes_cores_mean']:.1f} other cores busy on average"
            if during.get("samples")
            else "load during not sampled"
        )
        sha, dirty = run["commit"]["sha"], run["commit"]["dirty"]
        text = (
            f"{machine['cores']} cores; load average {load['before']['loadavg_1m']:.1f} before, {other}; "
            f"{run['seconds']:.0f} s"
        )
        command = run["command"]
    elif "conditions" in figures:  # vllm_fidelity
        run = figures["conditions"]
        sha, dirty = run["commit"], False
        text = (
            f"{run['cpus']} cores; load average {run['load_average_before'][0]:.1f} before, "
            f"{run['load_average_after'][0]:.1f} after"
        )
        command = "python bench/vllm_fidelity.py"
    elif "device" in figures and "commit" in figures:  # bench/gpu.py on the lent GPU host
        sha, dirty = figures["commit"], bool(figures.get("commit_dirty"))
        text = f"the lent host's {figures['device'].split(',')[0]}"
        command = "python3 bench/gpu.py " + ("campaign" if "cells" in figures else "run")
    elif "_made_by" in figures:  # a GPU run from before bench/record.py
        sha, dirty = None, False
        text, command = figures["_made_by"]["when"], figures["_made_by"]["call_2_bench"]
    else:  # dispatch
        sha, dirty = figures["commit"], figures["dirty"]
        text = f"{figures['machine']['cpus']} cores; load average {figures['machine']['load_average_at_start'][0]:.1f} before"
        command = figures["command"]
    mark = (sha or "?")[:10] + (" + uncommitted changes" if dirty else "")
    return sha, f"{text}; commit {mark}; `{command}`"


def _n(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


def coverage_rows(f: Figures) -> list[Row]:
    old = {name: cells for name, cells in f["table"].items() if "percentile bootstrap" in name}
    old_3 = [cells["3"] for cells in old.values() if cells.get("3") is not None]
    old_7 = [cells["7"] for cells in old.values() if cells.get("7") is not None]
    p99 = f["p99_interval"]
    bounded = {k: v for k, v in p99.items() if v["high_rank"] is not None}
    unbounded = sorted({k.split("n=")[1] for k, v in p99.items() if v["high_rank"] is None}, key=int)
    rows: list[Row] = [
        (
            f"worst simulated coverage of a gate's {f['nominal']:.0%} interval, n = 5..30 "
            f"({f['experiments_per_cell']:,} experiments a cell; MC s.e. {f['monte_carlo_se_at_nominal']:.3f})",
            f"{f['worst_coverage_n5_to_30']:.3f} ({f['worst_cell']})",
            f">= {f['nominal']:.2f} - noise",
        )
    ]
    if old_3 and old_7:
        rows.append(
            (
                "the old percentile bootstrap of the median, for reference, n = 3 / 7",
                f"{min(old_3):.2f}-{max(old_3):.2f} / {min(old_7):.2f}-{max(old_7):.2f}",
                "",
            )
        )
    rows.append(
        (
            f"a p99's order-statistic {f['nominal']:.0%} interval on latency-like samples: claimed / simulated "
            f"coverage (no upper bound at n = {', '.join(unbounded)})",
            "; ".join(f"{k}: {v['claimed']:.3f} / {v['simulated']:.3f}" for k, v in bounded.items()),
            f">= {f['nominal']:.2f}",
        )
    )
    return rows


def sandbox_rows(f: Figures) -> list[Row]:
    r = f["results"]
    host, shell, read = r["host sh -c true"], r["run_shell true"], r["read_file"]
    return [
        (
            f'`run_shell("true")` in bubblewrap incl. the step sweep / a bare `sh -c true`, median of '
            f"{f['rounds']} interleaved rounds (p90)",
            f"{_n(shell['median_ms'])} ms ({_n(shell['p90_ms'])}) / {_n(host['median_ms'])} ms = "
            f"{shell['ratio']:.1f}x",
            "",
        ),
        (
            "`read_file` through the sandbox, median (p90)",
            f"{_n(read['median_ms'])} ms ({_n(read['p90_ms'])})",
            "",
        ),
    ]


def api_body_limit_rows(f: Figures) -> list[Row]:
    return [
        (
            f"{row['request']}: answer, median time, peak extra server RSS ({len(row['runs'])} runs)",
            f"{', '.join(row['status'])}, {row['median_seconds']:.3f} s, {row['max_peak_extra_mib']:.1f} MiB",
            "",
        )
        for row in f["rows"]
    ]


def _interval(pair: list[float | None]) -> str:
    low, high = pair
    return f"[{low if low is not None else '-'}, {high if high is not None else 'unbounded'}]"


def audit_write_rows(f: Figures) -> list[Row]:
    return [
        (
            f"one audit write on SQLite (WAL), p50 / p99 [its 90% interval] over {f['writes_each']:,} writes "
            "each way, `synchronous=full`; `off`",
            f"{f['write_p50_ms_full']} / {f['write_p99_ms_full']} ms {_interval(f['write_p99_interval_ms_full'])}; "
            f"{f['write_p50_ms_off']} / {f['write_p99_ms_off']} ms {_interval(f['write_p99_interval_ms_off'])}",
            "",
        )
    ]


def _ms_interval(row: dict[str, Any], unit: float = 1.0, digits: int = 1) -> str:
    low, high = row["p99_ci90_ms"]
    low_s = _n(low / unit, digits) if low is not None else "-"
    high_s = _n(high / unit, digits) if high is not None else "unbounded"
    return f"{_n(row['p50_ms'] / unit, digits)} / {_n(row['p99_ms'] / unit, digits)} [{low_s}, {high_s}]"


def dispatch_rows(f: Figures) -> list[Row]:
    r = f["results"]
    codex, claude = r["codex dispatch (Temporal)"], r["claude dispatch (Temporal)"]
    return [
        (
            f"dispatch decision -> the real CLI's first model request, p50 / p99 [its 90% interval], s, "
            f"{codex['n']} dispatches each (Temporal, the attempt's checkout, the egress gateway, the sandbox and "
            "the CLI's own start): Codex CLI; Claude Code",
            f"{_ms_interval(codex, 1000, 2)}; {_ms_interval(claude, 1000, 2)}",
            "",
        ),
        (
            f"p50 of the agent's run alone (gateway, sandbox, forwarder, CLI) / of the CLI started bare on the host, "
            f"{r['codex bare (CLI start-up)']['n']} runs each, s: Codex CLI; Claude Code",
            f"{_n(r['codex sandboxed (agent.run)']['p50_ms'] / 1000, 2)} / "
            f"{_n(r['codex bare (CLI start-up)']['p50_ms'] / 1000, 2)}; "
            f"{_n(r['claude sandboxed (agent.run)']['p50_ms'] / 1000, 2)} / "
            f"{_n(r['claude bare (CLI start-up)']['p50_ms'] / 1000, 2)}",
            "",
        ),
    ]


def vllm_fidelity_rows(f: Figures) -> list[Row]:
    return [
        (
            "one vLLM CPU server (tiny-llama): Daedalus's client-timed decode tok/s / the server's own "
            "(`request_decode_time`), same requests, median",
            f"{f['server_ratio_median']:.3f}",
            "within 1%",
        ),
        (
            "Daedalus / `vllm bench serve` (adjacent runs); `vllm bench serve` / the server's own, medians",
            f"{f['vllm_bench_ratio_median']:.3f}; {f['vllm_bench_server_ratio_median']:.3f}",
            "",
        ),
        (
            "client CPU per streamed token: Daedalus / `vllm bench serve` (its `benchmark()` only)",
            f"{f['client_cpu_us_per_token']:.0f} / {f['vllm_bench_cpu_us_per_token']:.0f} µs",
            "<= 150 µs",
        ),
    ]


def harness_fidelity_rows(f: Figures) -> list[Row]:
    raw = f["raw"]
    return [
        (
            f"llama-server ({raw['model']} model, {raw['tokens']} tokens): client tok/s / the server's own "
            "`timings`, same requests, median; requests beyond 3%",
            f"{f['server_timings_ratio_median']:.3f}; {f['requests_beyond_3pct']:.0f} of "
            f"{len(raw['client_over_server'])}",
            "within 1%",
        ),
        (
            "client CPU per streamed token (whole process, measured rounds)",
            f"{f['client_cpu_us_per_token']:.0f} µs",
            "<= 150 µs",
        ),
        (
            "server-timed decode / `llama-bench` tg; coefficient of variation, warm drop-first / cold naive",
            f"{f['llama_bench_ratio']:.3f}; {f['cv_drop_first']:.3f} / {f['cv_naive']:.3f}",
            "",
        ),
    ]


def _lifecycle_part(r: dict[str, Any], parked: int) -> list[Row]:
    return [
        (
            f"`decide` with {parked:,} parked, one at a time: p50 / p99 [its 90% interval] / max, ms",
            f"{r['decide_p50_ms']} / {r['decide_p99_ms']} {_interval(r['decide_p99_ci90_ms'])} / {r['decide_max_ms']}",
            "p99 <= 100 ms",
        ),
        (
            f"`decide` with {parked:,} parked, back to back: p50 / p99 [its 90% interval], ms",
            f"{r['decide_back_to_back_p50_ms']} / {r['decide_back_to_back_p99_ms']} "
            f"{_interval(r['decide_back_to_back_p99_ci90_ms'])}",
            "p99 <= 100 ms",
        ),
        (
            f"{parked:,} parked: all parked in, s; control worker RSS, MB; full collections parking / deciding, "
            "longest pause deciding, ms",
            f"{r['all_parked_s']}; {r['parked_worker_rss_mb']}; {r['full_collections_parking']} / "
            f"{r['full_collections_deciding']}, {r['longest_collection_ms_deciding']}",
            "",
        ),
    ]


def lifecycle_rows(f: Figures) -> list[Row]:
    rows: list[Row] = [
        (
            f"ticket lifecycle / a bare workflow with the same activities ({f['tickets']} each, {f['rounds']} "
            "interleaved rounds, client-timed, fake instant host activities): total; per round",
            f"{f['overhead_ratio']:.2f}x ({f['ticket_s']:.2f} / {f['bare_s']:.2f} s); "
            + " ".join(f"{r:.2f}" for r in f["round_ratios"]),
            "<= 1.10x",
        ),
        *_lifecycle_part(f, f["parked_tickets"]),
    ]
    for key in sorted(k for k in f if k.startswith("parked_tickets_")):
        count = f[key]
        part = {k.removesuffix(f"_{count}"): v for k, v in f.items() if k.endswith(f"_{count}")}
        rows += _lifecycle_part(part, count)
    return rows


def _gate(g: dict[str, Any]) -> str:
    interval = f" [{g['ci'][0]:.4g}, {g['ci'][1]:.4g}]" if g["ci"][0] != g["ci"][1] else ""
    n = f", n = {g['n']}" if "n" in g else ""
    return f"{g['median']:.4g}{interval} {g['unit']}{n}"


def h200_rows(f: Figures) -> list[Row]:
    gates = f["gates"]
    passed = sum(1 for gate in gates.values() if gate["verdict"] == "PASS")
    return [
        (
            f"{f['device']}: llama-server decode, 1B f16 model, server-timed / client-timed / llama-bench tg128, tok/s",
            f"{f['decode_tps_median']:.1f} / {f['client_decode_tps_median']:.1f} / {f['llama_bench_tg_tps']:.1f}",
            "",
        ),
        (
            "floor_fraction: decode / the copy-bandwidth floor (bytes read per token / measured copy bandwidth)",
            f"{f['floor_fraction']:.3f} (floor {f['bandwidth_floor_tps']:,.0f} tok/s at {f['copy_bandwidth_gbs']:,.0f} GB/s)",
            "",
        ),
        (
            "a GPU ticket, q8_0 KV with flash attention, its gates confined on the leased GPU: outcome, gates passed; "
            "decode median [90%]; floor fraction; temp-0 identity vs f16 KV (near-tie rule); KiB/token from NVML",
            f"{f['ticket_status']}, {passed} of {len(gates)}; " + "; ".join(_gate(g) for g in gates.values()),
            "",
        ),
        (
            "a training run with a leak on the GPU: deaths / graceful stops / hunting tickets",
            f"{f['training_deaths']} / {f['training_graceful_stops']} / {len(f['hunting_tickets'])}",
            "",
        ),
    ]


def watchdog_rows(f: Figures) -> list[Row]:
    steady = f["steady_cpu"]
    rows: list[Row] = [
        (
            f"watchdog CPU watching a flat trainer, % of one core, median of {len(next(iter(steady.values()))['cpu_pct_of_one_core'])} "
            "x 30 s: " + "; ".join(steady),
            "; ".join(f"{v['median']:.2f}" for v in steady.values()),
            "< 1%",
        )
    ]
    for mode, r in f["spike_summary"].items():
        decision, exit_ = r["ms_to_stop_decision_median_max"], r["ms_to_trainer_exit_median_max"]
        rows.append(
            (
                f"a {f['spike_rate_asked_gib_per_s']:g} GiB/s spike asked (reached {r['rate_reached_gib_per_s_median']:g}, "
                f"median) into a {f['trainer_cgroup_limit_mib']} MiB cgroup, {mode}: graceful stops with a complete "
                "checkpoint / OOM kills; spike start -> stop decision, -> trainer exit, median / max ms; "
                "watchdog CPU %",
                f"{r['graceful_stops']}/{r['runs']} with {r['checkpoints_complete']} / {r['runs_oom_killed_in_trainer_cgroup']}; "
                f"{decision[0]:,.0f} / {decision[1]:,.0f}, {exit_[0]:,.0f} / {exit_[1]:,.0f}; "
                f"{r['watchdog_cpu_pct_median']:.1f}",
                "graceful, before the OOM killer",
            )
        )
    return rows


def pool_rows(f: Figures) -> list[Row]:
    return [
        (
            f"GPU pool ({f['hosts']} hosts, 6 processes, simulated GPUs: the NVML reader is tested on recorded H200 "
            f"output), {f['steps_submitted']} contending steps and {f['tickets_filed']} tickets' gates, a worker "
            "SIGKILLed mid-lease: overlapping GPU leases",
            str(f["overlapping_gpu_leases"]),
            "0",
        ),
        (
            "lease hand-off (GPUs free -> holder sees its grant), p50 / p99 ms; a step's wait for its lease, p50 / p99 ms",
            f"{f['lease_grant_p50_ms']:,.0f} / {f['lease_grant_p99_ms']:,.0f}; "
            f"{f['lease_wait_p50_ms']:,.0f} / {f['lease_wait_p99_ms']:,.0f}",
            "",
        ),
        (
            "tenant pauses = resumes; expired leases recovered; tickets' gates under a lease; tickets passed (each "
            "gate measures its own GPU job's work)",
            f"{f['tenant_pauses']} = {f['tenant_resumes']}; {f['expired_leases_recovered']} of {f['expired_leases']}; "
            f"{f['ticket_gates_under_lease']} of {f['ticket_gates_run']}; {f['tickets_passed']} of {f['tickets_filed']}",
            "",
        ),
    ]


def campaign_rows(f: Figures) -> list[Row]:
    kib: dict[str, list[float]] = {}
    for cell in f["matrix"]:
        kv = cell["cell"].split("/")[0].removeprefix("kv=")
        if cell["kib_per_token"] is not None:
            kib.setdefault(kv, []).append(cell["kib_per_token"])
    return [
        (
            f"campaign {f['campaign']} ({f['engine']}): cells / measured / crashed / invalid; wall time",
            f"{f['cells']} / {f['cells_measured']} / {f['cells_crashed']} / {f['cells_invalid']}; "
            f"{f['campaign_s']:.0f} s",
            "",
        ),
        (
            "KiB/token, the fitted slope per cell, by KV type (the arithmetic: f16 2.0, q8_0 1.06)",
            "; ".join(f"{kv} {min(v):.2f}-{max(v):.2f}" for kv, v in kib.items()),
            "",
        ),
        ("the proposal", f["proposal_reason"], ""),
        ("the self-contained HTML report of the campaign", f"{f['report_html_bytes']:,} bytes", ""),
    ]


def chaos_rows(f: Figures) -> list[Row]:
    kinds = f["faults_by_kind"]
    faults = (
        f"{kinds.get('host', 0)} host-worker and {kinds.get('control', 0)} control-worker SIGKILLs, "
        f"{kinds.get('temporal', 0)} Temporal SIGKILL + restarts, {kinds.get('api', 0)} API SIGKILLs"
    )
    return [
        (
            f"{f['store']} store: {f['tickets']} tickets of every kind, a training run and the decider's answers over "
            f"the API, under {f['faults']} faults in {f['window_s']:.0f} s ({faults}; seed {f['seed']}): tickets "
            "closed / wrong outcomes / audit gaps / duplicates / duplicate agent or trainer starts / orphan "
            "processes; `audit verify`",
            f"{f['tickets_closed']} of {f['tickets']} / {f['wrong_outcomes']} / {f['audit_gaps']} / "
            f"{f['audit_duplicates']} / {f['duplicate_starts']} / {f['orphan_processes']}; "
            f"{'verifies' if f['audit_chain_ok'] else 'FAILS'}",
            "all closed, all 0, verifies",
        ),
        (
            "decisions sent (with the retries a fault forces) / applied once each; agent starts; trainer starts; "
            "the training run",
            f"{f['decisions_sent']} / {f['decisions_applied']}; {f['agent_starts']}; {f['trainer_starts']}; "
            f"{f['training_run']}",
            "",
        ),
    ]


def h200_campaign_rows(f: Figures) -> list[Row]:
    measured = [c for c in f["cells"] if c["outcome"] == "measured"]
    invalid = [c for c in f["cells"] if c["outcome"] != "measured"]

    def shown(cell: dict[str, Any] | None) -> str:
        if cell is None:
            return "not measured"
        low, high = cell["floor_ci"]
        interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        return f"{cell['preset']}: {cell['floor_fraction']:.3f}{interval}, {cell['decode_tps']:.0f} tok/s"

    best = max(measured, key=lambda c: c["floor_fraction"] or 0.0, default=None)
    return [
        (
            f"campaign {f['campaign']}: KV x flash attention x (batch, micro-batch) x threads, cells measured / "
            "not runnable (a quantized V cache needs flash attention) / total; its status",
            f"{len(measured)} / {len(invalid)} / {f['cells_total']} in {f['campaign_s']:.0f} s; {f['status']}",
            "",
        ),
        (
            "floor fraction [90% interval] of llama.cpp's default serving preset's cell (f16, flash attention, "
            "batch 2048/512, 4 threads)",
            shown(f["default_cell"]),
            "",
        ),
        (
            "the proposal's cell (smallest KV among the not-slower on the Pareto front)",
            shown(f["proposed_cell"]),
            "beats the default",
        ),
        ("the highest floor fraction measured", shown(best), ""),
    ]


def cli_startup_rows(f: Figures) -> list[Row]:
    """Each decider's command: wall median (max) and CPU, met or MISSED; the baseline commit's beside it."""
    baseline = f.get("baseline")
    rows: list[Row] = []
    for name, row in f["commands"].items():
        value = f"{row['wall_s']['median']:.2f} s ({row['wall_s']['max']:.2f} max), CPU {row['cpu_s']['median']:.2f} s"
        if baseline is not None:
            old = baseline["commands"][name]
            value += f"; at {baseline['commit'][:10]}: {old['wall_s']['median']:.2f} s, CPU {old['cpu_s']['median']:.2f} s"
        verdict = "met" if row["goal_met"] else "MISSED"
        rows.append(
            (
                f"`daedalus {name}` start-up to exit, median of {f['rounds']} against a running `daedalus up`",
                value,
                f"< {f['goal_s']:.0f} s wall: {verdict}",
            )
        )
    return rows


RENDERERS: dict[str, Callable[[Figures], list[Row]]] = {
    "coverage": coverage_rows,
    "sandbox": sandbox_rows,
    "api_body_limit": api_body_limit_rows,
    "audit_write": audit_write_rows,
    "harness_fidelity": harness_fidelity_rows,
    "vllm_fidelity": vllm_fidelity_rows,
    "dispatch": dispatch_rows,
    "lifecycle": lifecycle_rows,
    "watchdog": watchdog_rows,
    "pool": pool_rows,
    "campaign": campaign_rows,
    "chaos-sqlite": chaos_rows,
    "chaos-postgres": chaos_rows,
    "h200": h200_rows,
    "h200-campaign": h200_campaign_rows,
    "cli_startup": cli_startup_rows,
}
"""One renderer per reference file, in the order the table shows them."""
NEEDS_A_GPU = {"h200", "h200-campaign"}
"""Runs only the lent GPU host makes: the table leaves them out while their file is absent (bench/reference/history/
keeps the runs made at earlier commits)."""
SCRIPTS = {"h200": "gpu", "h200-campaign": "gpu", "chaos-sqlite": "chaos", "chaos-postgres": "chaos"}
"""Reference files named otherwise than the script that made them."""


def references(directory: Path = REFERENCE) -> dict[str, Figures]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))}


def table(found: dict[str, Figures]) -> str:
    lines = [START, "", "| benchmark | figure | value | goal |", "|---|---|---|---|"]
    for name, render in RENDERERS.items():
        if name not in found:
            continue
        figures = found[name]
        for number, (figure, value, goal) in enumerate(render(figures)):
            where = f"`bench/{SCRIPTS.get(name, name)}.py` ({provenance(figures)[1]})" if number == 0 else ""
            lines.append(
                "| " + " | ".join(cell.replace("|", "\\|") for cell in (where, figure, value, goal)) + " |"
            )
    return "\n".join([*lines, "", END])


def readme_block(text: str) -> str:
    """The part of the README between the markers (markers included)."""
    start, end = text.index(START), text.index(END) + len(END)
    return text[start:end]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the README's table with this one")
    args = parser.parse_args()
    made = table(references())
    if not args.write:
        print(made)
        return
    text = README.read_text()
    README.write_text(text.replace(readme_block(text), made))
    print(f"wrote the benchmark table into {README.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
