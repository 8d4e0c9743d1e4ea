"""Ticket lifecycle overhead and parked-ticket cost, on a dev server of its own.

(a) N ticket lifecycles (no approval, one attempt, build, one gate) whose activities are fakes that return at
    once, registered under the real names (`run_attempt`, `run_build`, `run_gate`, `record_audit_event`,
    `notify_decision_request`),
    against a bare workflow running the same number of trivial activities on the same queues: same server, same
    worker process, batches interleaved. The ratio is what TicketWorkflow's own logic costs (goal <= 1.3x).
(b) 1,000 tickets parked awaiting dispatch approval: the worker process's RSS, then `decide` updates spread over them
    (through `daedalus.services.decide`, one at a time, each approved ticket run to its end before the next decision
    so that the round trip is not measured against the backlog of earlier approvals) and its round trip p50/p99
    (goal p99 <= 100 ms).

The worker runs in a child process (so its RSS is its own), with the fakes. Results: bench/results/lifecycle.json.
Run: .venv/bin/python bench/lifecycle.py [--tickets 120] [--rounds 6] [--parked 1000] [--decides 250] [--in-memory]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table
from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from bare_workflow import BareWorkflow  # bench/ is on sys.path when the script runs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daedalus import services as daedalus  # noqa: E402
from daedalus.activities.refs import (  # noqa: E402
    NOTIFY_DECISION_REQUEST,
    RECORD_AUDIT_EVENT,
    RUN_ATTEMPT,
    RUN_BUILD,
    RUN_GATE,
)
from daedalus.decisions.schemas import TicketSubject  # noqa: E402
from daedalus.devserver import DevServer  # noqa: E402
from daedalus.ids import host_queue, ticket_workflow_id  # noqa: E402
from daedalus.ports import free_port  # noqa: E402
from daedalus.schemas.agents import AgentResult, ExitReason  # noqa: E402
from daedalus.schemas.audit import AuditRecord  # noqa: E402
from daedalus.schemas.gates import GateResult, Verdict  # noqa: E402
from daedalus.schemas.notify import NotifyOutcome, NotifyResult  # noqa: E402
from daedalus.schemas.steps import AttemptInput, BuildInput, BuildResult, GateInput  # noqa: E402
from daedalus.schemas.ticket import Decision, DecisionRequest, TicketSpec, TicketStatus  # noqa: E402
from daedalus.workflows.ticket import TicketWorkflow  # noqa: E402

HOST = "bench"
CONTROL = "bench-control"
RESULTS = ROOT / "bench" / "results" / "lifecycle.json"


# ---- the fakes: the real activity names, instant results ------------------------------------------------


@activity.defn(name=RUN_ATTEMPT.name)
async def fake_attempt(request: AttemptInput) -> AgentResult:
    return AgentResult(
        ticket_id=request.spec.id,
        attempt=request.attempt,
        agent="bench",
        exit_reason=ExitReason.COMMITTED,
        branch=f"daedalus/{request.spec.id}/attempt-{request.attempt}",
        commit="0" * 40,
        diff_stat="1 file changed",
    )


@activity.defn(name=RUN_BUILD.name)
async def fake_build(request: BuildInput) -> BuildResult:
    return BuildResult(ok=True, returncode=0, log="")


@activity.defn(name=RUN_GATE.name)
async def fake_gate(request: GateInput) -> GateResult:
    gate = request.gate
    return GateResult(
        gate=gate.name,
        metric=gate.metric,
        verdict=Verdict.PASS,
        reason="bench",
        rule=gate.describe(),
        method="bench",
        samples=[56.0] * 7,
        median=56.0,
    )


@activity.defn(name=RECORD_AUDIT_EVENT.name)
async def fake_audit(record: AuditRecord) -> bool:
    return True


@activity.defn(name=NOTIFY_DECISION_REQUEST.name)
async def fake_notify(request: DecisionRequest) -> NotifyResult:
    return NotifyResult(outcome=NotifyOutcome.NOT_CONFIGURED)


@activity.defn(name="noop")
async def noop(n: int) -> int:
    return n


async def run_worker(address: str) -> None:
    """The worker process: TicketWorkflow and the bare workflow on the control queue, fakes on both queues."""
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    control = Worker(
        client,
        task_queue=CONTROL,
        workflows=[TicketWorkflow, BareWorkflow],
        activities=[fake_audit, fake_notify, noop],
        max_concurrent_activities=50,
    )
    host = Worker(
        client,
        task_queue=host_queue(HOST),
        activities=[fake_attempt, fake_build, fake_gate, noop],
        max_concurrent_activities=50,
    )
    async with control, host:
        print("worker ready", flush=True)
        await asyncio.Event().wait()


# ---- the measurements -----------------------------------------------------------------------------------


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def spec(approval: bool) -> TicketSpec:
    return TicketSpec.model_validate(
        {
            "id": f"b{uuid.uuid4().hex[:10]}",
            "title": "bench ticket",
            "engine": {"name": "toy", "kind": "llama_cpp", "repo": "/nonexistent", "base_commit": "main"},
            "host": HOST,
            "agent": {"name": "scripted", "commands": ["true"]},
            "build": {"command": "true"},
            "gates": [{"name": "decode", "metric": "decode_tps", "threshold": 55, "command": "true"}],
            "approval": {"dispatch_requires_approval": approval},
            "max_attempts": 1,
        }
    )


async def ticket_shape(client: Client) -> list[str]:
    """Run one ticket and read, from its history, the queue of each activity it scheduled, in order."""
    handle = await daedalus.file_ticket(client, spec(approval=False), queue=CONTROL)
    assert (await handle.result()).status is TicketStatus.PASSED
    queues = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            queues.append(event.activity_task_scheduled_event_attributes.task_queue.name)
    return queues


async def ticket_batch(client: Client, n: int) -> float:
    start = time.perf_counter()
    handles = await asyncio.gather(
        *(daedalus.file_ticket(client, spec(False), queue=CONTROL) for _ in range(n))
    )
    states = await asyncio.gather(*(h.result() for h in handles))
    took = time.perf_counter() - start
    assert all(s.status is TicketStatus.PASSED for s in states), {s.status for s in states}
    return took


async def bare_batch(client: Client, n: int, queues: list[str]) -> float:
    start = time.perf_counter()
    handles = await asyncio.gather(
        *(
            client.start_workflow(BareWorkflow.run, queues, id=f"bare-{uuid.uuid4()}", task_queue=CONTROL)
            for _ in range(n)
        )
    )
    done = await asyncio.gather(*(h.result() for h in handles))
    took = time.perf_counter() - start
    assert done == [len(queues)] * n
    return took


async def overhead(client: Client, tickets: int, rounds: int) -> dict[str, Any]:
    queues = await ticket_shape(client)
    await bare_batch(client, 5, queues)  # warm both paths
    await ticket_batch(client, 5)
    per_round = max(1, tickets // rounds)
    ticket_s: list[float] = []
    bare_s: list[float] = []
    for r in range(rounds):
        pair = [("ticket", ticket_batch(client, per_round)), ("bare", bare_batch(client, per_round, queues))]
        for kind, job in pair if r % 2 == 0 else reversed(pair):  # alternate who goes first
            (ticket_s if kind == "ticket" else bare_s).append(await job)
        progress(f"round {r + 1}/{rounds}: ticket {ticket_s[-1]:.2f}s, bare {bare_s[-1]:.2f}s")
    total_tickets = per_round * rounds
    return {
        "activities_per_ticket": len(queues),
        "host_activities_per_ticket": sum(1 for q in queues if q == host_queue(HOST)),
        "tickets": total_tickets,
        "rounds": rounds,
        "ticket_s": round(sum(ticket_s), 3),
        "bare_s": round(sum(bare_s), 3),
        "overhead_ratio": round(sum(ticket_s) / sum(bare_s), 3),
        "round_ratios": [round(t / b, 3) for t, b in zip(ticket_s, bare_s, strict=True)],
        "tickets_per_s": round(total_tickets / sum(ticket_s), 2),
        "bare_workflows_per_s": round(total_tickets / sum(bare_s), 2),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def parked(client: Client, count: int, decides: int, worker: psutil.Process) -> dict[str, Any]:
    rss_before = worker.memory_info().rss
    specs = [spec(approval=True) for _ in range(count)]
    start = time.perf_counter()
    for i in range(0, count, 100):
        await asyncio.gather(*(daedalus.file_ticket(client, s, queue=CONTROL) for s in specs[i : i + 100]))
    filed_s = time.perf_counter() - start
    progress(f"filed {count} tickets awaiting approval in {filed_s:.1f}s")
    # Parked = each one has asked for its decision: its DaedalusStatus search attribute says so (1,000 status
    # queries at once would only measure the query path).
    deadline = time.monotonic() + 240
    while (waiting := (await client.count_workflows("DaedalusStatus = 'awaiting_approval'")).count) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {waiting} of {count} tickets parked")
        await asyncio.sleep(0.5)
    parked_s = time.perf_counter() - start
    progress(f"all {count} parked after {parked_s:.1f}s")
    await asyncio.sleep(2)  # let the worker settle
    rss_parked = worker.memory_info().rss
    chosen = specs[:: max(1, count // decides)]
    half = len(chosen) // 2
    rtts: list[float] = []
    for s in chosen[:half]:
        decision = Decision(request_id=f"{s.id}-dispatch-1", option="approve", decided_by="wayne")
        t0 = time.perf_counter()
        await daedalus.decide(client, decision, subject=TicketSubject(ticket_id=s.id))
        rtts.append((time.perf_counter() - t0) * 1000)
        # The approved ticket now runs its 10 steps; let it finish (untimed) so the next round trip is measured
        # against the parked tickets, not against the backlog the previous decisions set going.
        await client.get_workflow_handle(ticket_workflow_id(s.id)).result()
    # Then back to back: each approval starts a ticket that competes with the next decision for the 2 cores.
    busy: list[float] = []
    for s in chosen[half:]:
        decision = Decision(request_id=f"{s.id}-dispatch-1", option="approve", decided_by="wayne")
        t0 = time.perf_counter()
        await daedalus.decide(client, decision, subject=TicketSubject(ticket_id=s.id))
        busy.append((time.perf_counter() - t0) * 1000)
    progress(f"{len(rtts) + len(busy)} decide updates done")
    await asyncio.sleep(2)
    closed = await asyncio.gather(*(daedalus.status(client, s.id) for s in specs[:1]))
    bad = [
        (st.spec.id, st.status.value, st.decisions, st.pending_decision)
        for st in closed
        if not (st.decisions and st.decisions[0].option == "approve")
    ]
    assert not bad, bad[:2]
    rtts_sorted = sorted(rtts)
    return {
        "parked_tickets": count,
        "file_s": round(filed_s, 2),
        "all_parked_s": round(parked_s, 2),
        "worker_rss_before_mb": round(rss_before / 2**20, 1),
        "parked_worker_rss_mb": round(rss_parked / 2**20, 1),
        "rss_per_parked_ticket_kb": round((rss_parked - rss_before) / count / 1024, 1),
        "decide_updates": len(rtts),
        "decide_p50_ms": round(statistics.median(rtts), 2),
        "decide_p99_ms": round(rtts_sorted[min(len(rtts) - 1, round(0.99 * (len(rtts) - 1)))], 2),
        "decide_max_ms": round(rtts_sorted[-1], 2),
        "decide_back_to_back_p50_ms": round(statistics.median(busy), 2),
        "decide_back_to_back_p99_ms": round(percentile(busy, 0.99), 2),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="daedalus-bench-") as tmp:
        server = DevServer(
            db_file=None if args.in_memory else Path(tmp) / "temporal.db",
            port=free_port(),
            ui_port=None,
            log_file=Path(tmp) / "server.log",
        )
        with server:
            log = Path(tmp) / "worker.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, __file__, "--worker", server.address],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:
                deadline = time.monotonic() + 60
                while "worker ready" not in log.read_text():
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"worker did not start: {log.read_text()[-2000:]}")
                    await asyncio.sleep(0.1)
                client = await daedalus.connect(server.address)
                t0 = time.perf_counter()
                a = await overhead(client, args.tickets, args.rounds)
                a_s = time.perf_counter() - t0
                b = await parked(client, args.parked, args.decides, psutil.Process(proc.pid))
                b_s = time.perf_counter() - t0 - a_s
            finally:
                proc.terminate()
                proc.wait(10)
    return {
        **a,
        **b,
        "part_a_s": round(a_s, 1),
        "part_b_s": round(b_s, 1),
        "temporal_store": "dev server, in memory" if args.in_memory else "dev server on a SQLite file",
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}",
    }


def show(result: dict[str, Any]) -> None:
    table = Table(title="TicketWorkflow lifecycle benchmark (fake instant activities)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("goal")
    rows = [
        (
            "activities per ticket (host queue)",
            f"{result['activities_per_ticket']} ({result['host_activities_per_ticket']})",
            "",
        ),
        (
            "tickets / bare workflows",
            f"{result['tickets']} / {result['tickets']} in {result['rounds']} interleaved rounds",
            "",
        ),
        ("ticket lifecycles, total s", f"{result['ticket_s']:.2f}", ""),
        ("bare workflows, total s", f"{result['bare_s']:.2f}", ""),
        ("overhead ratio (ticket / bare)", f"{result['overhead_ratio']:.3f}x", "<= 1.3x"),
        ("per-round ratios", " ".join(f"{r:.2f}" for r in result["round_ratios"]), ""),
        ("tickets/s", f"{result['tickets_per_s']:.1f}", ""),
        (
            "parked tickets (filed in / all parked in)",
            f"{result['parked_tickets']} ({result['file_s']}s / {result['all_parked_s']}s)",
            "",
        ),
        (
            "worker RSS before / parked, MB",
            f"{result['worker_rss_before_mb']} / {result['parked_worker_rss_mb']}",
            "",
        ),
        ("RSS per parked ticket, KB", f"{result['rss_per_parked_ticket_kb']}", ""),
        (
            "decide round trip p50 / p99 / max, ms",
            f"{result['decide_p50_ms']} / {result['decide_p99_ms']} / {result['decide_max_ms']}",
            "p99 <= 100 ms",
        ),
        (
            "decide back to back (approvals pile up) p50 / p99, ms",
            f"{result['decide_back_to_back_p50_ms']} / {result['decide_back_to_back_p99_ms']}",
            "p99 <= 100 ms",
        ),
    ]
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tickets", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--parked", type=int, default=1000)
    parser.add_argument(
        "--decides", type=int, default=250, help="decide updates timed, spread over the parked"
    )
    parser.add_argument("--in-memory", action="store_true", help="dev server without its SQLite file")
    parser.add_argument("--worker", metavar="ADDRESS", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        asyncio.run(run_worker(arguments.worker))
        raise SystemExit(0)
    outcome = asyncio.run(main(arguments))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(outcome, indent=2) + "\n")
    show(outcome)
    print(f"wrote {RESULTS.relative_to(ROOT)}")
