"""Ticket lifecycle overhead and parked-ticket cost, on a dev server of its own.

(a) N ticket lifecycles (no approval, one attempt, build, one gate) whose activities are fakes that return at
    once, registered under the real names (`run_attempt`, `run_build`, `run_gate`, `record_audit_event`,
    `notify_decision_request`, `lessons_for`, `record_lessons`: one missing is retried for seconds, and the ratio
    measures that wait),
    against a bare workflow running the same number of trivial activities (remote ones on the same queues, local
    ones where the ticket runs local activities): same server, same worker process, batches interleaved. The
    ratio is what TicketWorkflow's own logic costs (goal <= 1.3x).
(b) For each count in --parked (1,000, and 5,000: past temporalio's workflow cache of 1,000 by default), that many
    tickets parked awaiting dispatch approval on a fresh control worker assembled as `daedalus worker` assembles it
    (`daedalus.worker.control_worker`: the real audit store on an SQLite file, the real Slack notifier without a
    token) with fake host activities: the worker process's RSS, then `decide` updates spread over them (through
    `daedalus.services.decide`), first one at a time, each approved ticket run to its end before the next decision
    (so the round trip is not measured against the backlog of earlier approvals), then back to back (a decider
    clearing a channel of approvals). Goal: p99 <= 100 ms both ways. Each p99 comes with its distribution-free
    90% interval (order statistics: `daedalus.gates.statistics.quantile_interval`, coverage simulated in
    tests/gates/test_coverage.py); the default 500 decides each way give it an upper bound, 125 did not.
    Where the back-to-back time goes is read from the workflow histories: for each decide, client send ->
    the update's workflow task scheduled -> started by the worker -> completed -> the client has the answer; and
    after it, how long until the decision and the next transition are in the audit store (what POST /decisions
    waits for).

The worker runs in a child process (so its RSS is its own). Results: bench/results/lifecycle.json (the first
parked count under plain keys, the others with the count as a suffix: `decide_p99_ms_5000`).
Run: .venv/bin/python bench/lifecycle.py [--tickets 120] [--rounds 6] [--parked 1000 5000] [--decides 1000]
     [--workflow-cache N] [--compare-remote-audit] [--results PATH] [--in-memory]
--compare-remote-audit runs the first count again on a worker that leaves the `audit-local-activity` patch off
(each audit event a remote activity, as before it), on the same server, keys `remote_audit_*`. With
PYTHONPATH=<another checkout>/src the benchmark measures that checkout's workflows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
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
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.worker import Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from bare_workflow import LOCAL, BareWorkflow  # bench/ is on sys.path when the script runs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daedalus import services as daedalus  # noqa: E402
from daedalus.activities.refs import (  # noqa: E402
    LESSONS_FOR,
    NOTIFY_DECISION_REQUEST,
    RECORD_AUDIT_EVENT,
    RECORD_AUDIT_EVENTS,
    RECORD_LESSONS,
    RUN_ATTEMPT,
    RUN_BUILD,
    RUN_GATE,
)
from daedalus.decisions.schemas import TicketSubject  # noqa: E402
from daedalus.devserver import DevServer  # noqa: E402
from daedalus.gates.statistics import quantile_interval  # noqa: E402
from daedalus.ids import host_queue, ticket_workflow_id  # noqa: E402
from daedalus.ports import free_port  # noqa: E402
from daedalus.processes import kill_me_with_parent  # noqa: E402
from daedalus.schemas.agents import AgentResult, ExitReason  # noqa: E402
from daedalus.schemas.audit import AuditBatch, AuditRecord  # noqa: E402
from daedalus.schemas.gates import GateResult, Verdict  # noqa: E402
from daedalus.schemas.lessons import LessonBatch, LessonQuery  # noqa: E402
from daedalus.schemas.notify import NotifyOutcome, NotifyResult  # noqa: E402
from daedalus.schemas.steps import AttemptInput, BuildInput, BuildResult, GateInput  # noqa: E402
from daedalus.schemas.ticket import Decision, DecisionRequest, TicketSpec, TicketStatus  # noqa: E402
from daedalus.store.database import make_engine, migrate  # noqa: E402
from daedalus.worker import WorkerConfig, control_worker  # noqa: E402

try:
    from daedalus.worker import settle_heap
except ImportError:  # a checkout from before it (PYTHONPATH=<another checkout>/src)

    def settle_heap() -> None:
        pass


try:
    from daedalus.payloads import DATA_CONVERTER
except ImportError:  # a checkout from before it: temporalio's pydantic converter
    from temporalio.contrib.pydantic import pydantic_data_converter as DATA_CONVERTER

try:
    from daedalus.worker import workflow_runner
except ImportError:  # a checkout from before it: Temporal's own runner

    def workflow_runner(sandboxed: bool, converter: DataConverter) -> WorkflowRunner:
        return SandboxedWorkflowRunner()


from daedalus.workflows.ticket import TicketWorkflow  # noqa: E402
from daedalus.workflows.trail import AUDIT_LOCAL_ACTIVITY  # noqa: E402
from record import Recording  # noqa: E402

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


@activity.defn(name=RECORD_AUDIT_EVENTS.name)
async def fake_audit_batch(batch: AuditBatch) -> int:
    return len(batch.records)


@activity.defn(name=LESSONS_FOR.name)
async def fake_lessons_for(query: LessonQuery) -> list[str]:
    return []


@activity.defn(name=RECORD_LESSONS.name)
async def fake_record_lessons(batch: LessonBatch) -> int:
    return len(batch.lessons)


@activity.defn(name=NOTIFY_DECISION_REQUEST.name)
async def fake_notify(request: DecisionRequest) -> NotifyResult:
    return NotifyResult(outcome=NotifyOutcome.NOT_CONFIGURED)


@activity.defn(name="noop")
async def noop(n: int) -> int:
    return n


def host_worker(client: Client) -> Worker:
    return Worker(
        client,
        task_queue=host_queue(HOST),
        activities=[fake_attempt, fake_build, fake_gate, noop],
        max_concurrent_activities=50,
    )


async def run_worker(
    address: str,
    store: str | None,
    workflow_cache: int | None,
    remote_audit: bool,
    hosts_only: bool,
    unsandboxed: bool,
) -> None:
    """A worker process. Without a store (part a): TicketWorkflow and the bare workflow on the control queue,
    fakes on both queues. With one (part b): the control worker as `daedalus worker --control` builds it, on
    that store, alone in its process as in production. `hosts_only`: the fake host activities (part b), in a
    process of their own as a GPU host's worker is."""
    client = await Client.connect(address, data_converter=DATA_CONVERTER)
    if hosts_only:
        async with host_worker(client):
            print("worker ready", flush=True)
            await asyncio.Event().wait()
    if store is None:
        control = Worker(
            client,
            task_queue=CONTROL,
            workflows=[TicketWorkflow, BareWorkflow],
            activities=[
                fake_audit,
                fake_audit_batch,
                fake_notify,
                fake_lessons_for,
                fake_record_lessons,
                noop,
            ],
            max_concurrent_activities=50,
            workflow_runner=workflow_runner(True, client.data_converter),  # the control worker's
        )
    else:
        engine = make_engine(store)
        migrate(engine)
        tmp = Path(store.removeprefix("sqlite:///")).parent
        config = WorkerConfig(
            control_queue=CONTROL, hosts=[], workspace_root=tmp / "ws", artifacts=tmp / "artifacts"
        )
        if "audit_key" in WorkerConfig.__dataclass_fields__:  # checkouts from before seals have none
            from daedalus.store.seals import AuditKey

            config = dataclasses.replace(config, audit_key=AuditKey(os.urandom(32)))
        # Changed only when asked, so that an older checkout's WorkerConfig runs this too.
        if workflow_cache is not None:
            config = dataclasses.replace(config, max_cached_workflows=workflow_cache)
        if remote_audit:  # the code before the patch: each audit event a remote activity
            # The ticket's patch bundle holds it: a ticket asks it on its own only without the bundle.
            off = {AUDIT_LOCAL_ACTIVITY, "ticket-patches-bundled"}
            config = dataclasses.replace(config, inactive_patches=frozenset(off))
        if unsandboxed:  # DAEDALUS_TEMPORAL_SANDBOX=false
            config = dataclasses.replace(config, sandboxed=False)
        async with control_worker(client, config, engine):
            settle_heap()  # as `daedalus worker` does once its workers run
            log_gc_pauses(tmp / f"gc-{os.getpid()}.log")
            print("worker ready", flush=True)
            await asyncio.Event().wait()
    async with control, host_worker(client):
        print("worker ready", flush=True)
        await asyncio.Event().wait()


def log_gc_pauses(log: Path) -> None:
    """Append `<unix time> <generation> <pause ms>` for each collection of the older generations (a full one walks
    every live object, and stalls every thread of the worker while it does)."""
    out = log.open("a", buffering=1)  # open for the process's life
    started = [0.0]

    def pause(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif info["generation"] >= 1:
            out.write(
                f"{time.time():.3f} {info['generation']} {(time.perf_counter() - started[0]) * 1000:.1f}\n"
            )

    gc.callbacks.append(pause)


def gc_pauses(store_dir: Path, since: float, until: float) -> dict[str, Any]:
    """The control workers' collections between two instants: full ones, and the longest pause of any."""
    pauses = [
        (int(generation), float(ms))
        for log in store_dir.glob("gc-*.log")
        for at, generation, ms in (line.split() for line in log.read_text().splitlines())
        if since <= float(at) <= until
    ]
    return {
        "full_collections": sum(1 for generation, _ in pauses if generation == 2),
        "longest_collection_ms": max((ms for _, ms in pauses), default=0.0),
    }


class WorkerProcess:
    """The worker in a child process of its own, so that its RSS is its own."""

    def __init__(
        self,
        address: str,
        log: Path,
        store: str | None = None,
        workflow_cache: int | None = None,
        remote_audit: bool = False,
        hosts_only: bool = False,
        unsandboxed: bool = False,
    ):
        command = [sys.executable, __file__, "--worker", address]
        if unsandboxed:
            command.append("--unsandboxed")
        if hosts_only:
            command.append("--host-worker")
        if remote_audit:
            command.append("--remote-audit")
        if store is not None:
            command += ["--store", store]
        if workflow_cache is not None:
            command += ["--workflow-cache", str(workflow_cache)]
        self.command, self.log = command, log

    async def __aenter__(self) -> psutil.Process:
        with self.log.open("wb") as out:
            # A benchmark killed half-way leaves no worker behind (Ctrl-C alone would run __aexit__).
            self.proc = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=kill_me_with_parent(os.getpid()),
            )
        deadline = time.monotonic() + 60
        while "worker ready" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker did not start: {self.log.read_text()[-2000:]}")
            await asyncio.sleep(0.1)
        return psutil.Process(self.proc.pid)

    async def __aexit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


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


LOCAL_ACTIVITY_MARKER = "core_local_activity"


def is_local_activity(event: HistoryEvent) -> bool:
    return (
        event.HasField("marker_recorded_event_attributes")
        and event.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER
    )


def local_audit_events(event: HistoryEvent) -> int:
    """How many audit events a local activity's marker records as written: 1 for `record_audit_event`, a batch's
    result for `record_audit_events`, 0 for any other marker (core keeps the activity type in its `data`)."""
    if not is_local_activity(event):
        return 0
    details = event.marker_recorded_event_attributes.details
    [data] = details["data"].payloads
    activity_type = json.loads(data.data)["activity_type"]
    if activity_type == RECORD_AUDIT_EVENT.name:
        return 1
    if activity_type == RECORD_AUDIT_EVENTS.name:
        [result] = details["result"].payloads
        return int(json.loads(result.data))
    return 0


async def ticket_shape(client: Client) -> list[str]:
    """Run one ticket and read, from its history, where each activity it ran ran, in order: the task queue of a
    remote one, `LOCAL` for a local one."""
    handle = await daedalus.file_ticket(client, spec(approval=False), queue=CONTROL)
    assert (await handle.result()).status is TicketStatus.PASSED
    shape = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            shape.append(event.activity_task_scheduled_event_attributes.task_queue.name)
        elif is_local_activity(event):
            shape.append(LOCAL)
    return shape


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
        "local_activities_per_ticket": sum(1 for q in queues if q == LOCAL),
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


def p99_interval(values: list[float]) -> list[float | None]:
    """The p99's distribution-free 90% interval; None on a side the samples cannot bound (fewer than 299 leave
    the top open: all of them fall below the true p99 with probability 0.99^n)."""
    return [None if v is None else round(v, 2) for v in quantile_interval(values, 0.99, 0.90)]


def shown(interval: list[float | None]) -> str:
    return f"[{interval[0]}, {'unbounded' if interval[1] is None else interval[1]}]"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def ms(value: float) -> float:
    return round(value * 1000, 2)


def update_task(events: list[Any]) -> tuple[int, float, float, float]:
    """A decide's update in its ticket's history: the index of its UpdateAccepted event and the times (s) its
    workflow task was scheduled, started and completed (the last of each before the acceptance)."""
    accepted = next(
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    )
    task: dict[int, float] = {}
    for e in events[:accepted]:
        task[e.event_type] = seconds(e)
    return (
        accepted,
        task[EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED],
        task[EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED],
        task[EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED],
    )


def seconds(event: HistoryEvent) -> float:
    return event.event_time.ToMicroseconds() / 1e6


def audit_write_ends(events: list[HistoryEvent]) -> list[float]:
    """When each audit event of a history was written, as the history shows it: a remote `record_audit_event`'s
    completion, or a local activity's marker (written when its workflow task completes; a batch's marker once for
    each event it wrote)."""
    audit_ids = {
        e.event_id
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == RECORD_AUDIT_EVENT.name
    }
    ends: list[float] = []
    for e in events:
        remote = (
            e.HasField("activity_task_completed_event_attributes")
            and e.activity_task_completed_event_attributes.scheduled_event_id in audit_ids
        )
        ends.extend([seconds(e)] * (1 if remote else local_audit_events(e)))
    return ends


def remote_audit_timings(events: list[HistoryEvent]) -> list[tuple[float, float]]:
    """(waited for an activity slot, ran) of each remote `record_audit_event` of a history, in seconds."""
    by_id = {e.event_id: e for e in events}
    timings = []
    for e in events:
        if not e.HasField("activity_task_completed_event_attributes"):
            continue
        done = e.activity_task_completed_event_attributes
        scheduled = by_id[done.scheduled_event_id]
        if scheduled.activity_task_scheduled_event_attributes.activity_type.name != RECORD_AUDIT_EVENT.name:
            continue
        started = by_id[done.started_event_id]
        timings.append((seconds(started) - seconds(scheduled), seconds(e) - seconds(started)))
    return timings


async def attribute(client: Client, decided: list[tuple[str, float, float]], prefix: str) -> dict[str, Any]:
    """Where each decide's time went, from its ticket's history (same clock as the client: one machine).

    update: client send -> the workflow task that carries the update is scheduled (server) -> started (waited for
    a worker's poller/slot) -> completed (the worker ran it) -> the client has the answer. recorded: send -> the
    decision and the next transition are in the audit store (what POST /decisions waits for)."""
    phases: dict[str, list[float]] = {
        k: [] for k in ("to_scheduled", "queued", "worker", "to_client", "recorded", "workflow_tasks")
    }
    audit_waits: list[float] = []
    audit_runs: list[float] = []
    for ticket_id, sent, answered in decided:
        handle = client.get_workflow_handle(ticket_workflow_id(ticket_id))
        events = [e async for e in handle.fetch_history_events()]
        accepted, scheduled, started, completed = update_task(events)
        phases["to_scheduled"].append(scheduled - sent)
        phases["queued"].append(started - scheduled)
        phases["worker"].append(completed - started)
        phases["to_client"].append(answered - completed)
        after = audit_write_ends(events[accepted:])
        phases["recorded"].append(after[1] - sent)  # the decided event, then the dispatched transition
        phases["workflow_tasks"].append(
            sum(1 for e in events[accepted:] if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
        )
        for waited, ran in remote_audit_timings(events[accepted:]):
            audit_waits.append(waited)
            audit_runs.append(ran)
    out: dict[str, Any] = {}
    for name, values in phases.items():
        if name == "workflow_tasks":
            out[f"{prefix}_workflow_tasks_after_decide"] = statistics.median(values)
            continue
        out[f"{prefix}_{name}_p50_ms"] = ms(statistics.median(values))
        out[f"{prefix}_{name}_p99_ms"] = ms(percentile(values, 0.99))
    if audit_runs:
        out[f"{prefix}_remote_audit_slot_wait_p50_ms"] = ms(statistics.median(audit_waits))
        out[f"{prefix}_remote_audit_run_p50_ms"] = ms(statistics.median(audit_runs))
    return out


async def parked_now(client: Client) -> int:
    return (await client.count_workflows("DaedalusStatus = 'awaiting_approval'")).count


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def rss(processes: list[psutil.Process]) -> int:
    return sum(p.memory_info().rss for p in processes)


async def parked(
    client: Client,
    count: int,
    decides: int,
    workers: list[psutil.Process],
    hosts: psutil.Process,
    temporal: psutil.Process,
    store_dir: Path,
) -> dict[str, Any]:
    rss_before = rss(workers)
    filing_from = time.time()
    load_before = load_average()
    specs = [spec(approval=True) for _ in range(count)]
    parked_before = await parked_now(client)  # those an earlier part left undecided
    start = time.perf_counter()
    for i in range(0, count, 100):
        await asyncio.gather(*(daedalus.file_ticket(client, s, queue=CONTROL) for s in specs[i : i + 100]))
    filed_s = time.perf_counter() - start
    progress(f"filed {count} tickets awaiting approval in {filed_s:.1f}s")
    # Parked = each one has asked for its decision: its DaedalusStatus search attribute says so (1,000 status
    # queries at once would only measure the query path).
    deadline = time.monotonic() + 60 + count * 0.25
    while (waiting := await parked_now(client) - parked_before) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {waiting} of {count} tickets parked")
        await asyncio.sleep(0.5)
    parked_s = time.perf_counter() - start
    progress(f"all {count} parked after {parked_s:.1f}s")
    await asyncio.sleep(2)  # let the worker settle
    rss_parked = rss(workers)
    deciding_from = time.time()
    chosen = specs[:: max(1, count // decides)]
    half = len(chosen) // 2
    rtts: list[float] = []
    spaced: list[tuple[str, float, float]] = []
    for s in chosen[:half]:
        decision = Decision(request_id=f"{s.id}-dispatch-1", option="approve", decided_by="wayne")
        sent, t0 = time.time(), time.perf_counter()
        await daedalus.decide(client, decision, subject=TicketSubject(ticket_id=s.id))
        rtts.append((time.perf_counter() - t0) * 1000)
        spaced.append((s.id, sent, time.time()))
        # The approved ticket now runs its 10 steps; let it finish (untimed) so the next round trip is measured
        # against the parked tickets, not against the backlog the previous decisions set going.
        await client.get_workflow_handle(ticket_workflow_id(s.id)).result()
    # Then back to back: each approval starts a ticket that competes with the next decision for the 2 cores.
    busy: list[float] = []
    # Who is busy while the decisions arrive back to back: CPU seconds per wall second (1.0 is one core's worth;
    # a worker process runs its Python on one core at a time, whatever its threads).
    processes = {"worker": workers, "hosts": [hosts], "temporal": [temporal], "client": [psutil.Process()]}
    cpu_before = {name: sum(map(cpu_s, ps)) for name, ps in processes.items()}
    wall_before = time.perf_counter()
    decided: list[tuple[str, float, float]] = []
    for s in chosen[half:]:
        decision = Decision(request_id=f"{s.id}-dispatch-1", option="approve", decided_by="wayne")
        sent, t0 = time.time(), time.perf_counter()
        await daedalus.decide(client, decision, subject=TicketSubject(ticket_id=s.id))
        busy.append((time.perf_counter() - t0) * 1000)
        decided.append((s.id, sent, time.time()))
    wall = time.perf_counter() - wall_before
    deciding_until = time.time()
    cpu_share = {
        name: round((sum(map(cpu_s, ps)) - cpu_before[name]) / wall, 2) for name, ps in processes.items()
    }
    load_after = load_average()
    progress(f"{len(rtts) + len(busy)} decide updates done")
    states = await asyncio.gather(
        *(
            client.get_workflow_handle_for(TicketWorkflow.run, ticket_workflow_id(s.id)).result()
            for s in chosen
        )
    )
    assert all(st.status is TicketStatus.PASSED for st in states), {st.status for st in states}
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
        "decide_p99_ms": round(percentile(rtts, 0.99), 2),
        "decide_p99_ci90_ms": p99_interval(rtts),
        "decide_max_ms": round(rtts_sorted[-1], 2),
        "decide_back_to_back_p50_ms": round(statistics.median(busy), 2),
        "decide_back_to_back_p99_ms": round(percentile(busy, 0.99), 2),
        "decide_back_to_back_p99_ci90_ms": p99_interval(busy),
        **await attribute(client, spaced, "spaced"),
        **await attribute(client, decided, "b2b"),
        **{f"b2b_cpu_share_{name}": share for name, share in cpu_share.items()},
        **{f"{k}_parking": v for k, v in gc_pauses(store_dir, filing_from, deciding_from).items()},
        **{f"{k}_deciding": v for k, v in gc_pauses(store_dir, deciding_from, deciding_until).items()},
        "load_average_before": load_before,
        "load_average_after": load_after,
    }


async def parked_part(
    client: Client,
    temporal: psutil.Process,
    tmp: Path,
    count: int,
    args: argparse.Namespace,
    remote_audit: bool = False,
    unsandboxed: bool = False,
) -> dict[str, Any]:
    """Part (b) for `count` parked tickets, on fresh control workers (--control-workers of them, on one task
    queue: Temporal spreads the tickets over them) and a fresh audit store."""
    t0 = time.perf_counter()
    name = f"{count}{'-remote-audit' if remote_audit else ''}{'-unsandboxed' if unsandboxed else ''}"
    store = f"sqlite:///{tmp / f'store-{name}' / 'daedalus.db'}"
    address = client.service_client.config.target_host
    async with contextlib.AsyncExitStack() as stack:
        hosts = await stack.enter_async_context(
            WorkerProcess(address, tmp / f"hosts-{name}.log", hosts_only=True)
        )
        workers = [
            await stack.enter_async_context(
                WorkerProcess(
                    address,
                    tmp / f"worker-{name}-{n}.log",
                    store,
                    args.workflow_cache,
                    remote_audit,
                    unsandboxed=unsandboxed,
                )
            )
            for n in range(args.control_workers)
        ]
        b = await parked(client, count, args.decides, workers, hosts, temporal, tmp / f"store-{name}")
    b["control_workers"] = args.control_workers
    b["part_b_s"] = round(time.perf_counter() - t0, 1)
    return b


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="daedalus-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        server = DevServer(
            db_file=None if args.in_memory else tmp / "temporal.db",
            port=free_port(),
            ui_port=None,
            log_file=tmp / "server.log",
            die_with_parent=True,  # a benchmark killed half-way leaves no server behind
        )
        result: dict[str, Any] = {"load_average_at_start": load_average()}
        with server:
            client = await daedalus.connect(server.address)
            t0 = time.perf_counter()
            async with WorkerProcess(server.address, tmp / "worker-a.log"):
                result.update(await overhead(client, args.tickets, args.rounds))
            result["part_a_s"] = round(time.perf_counter() - t0, 1)
            assert server.process is not None
            temporal = psutil.Process(server.process.pid)
            for n, count in enumerate(args.parked):
                b = await parked_part(client, temporal, tmp, count, args)
                result.update(b if n == 0 else {f"{k}_{count}": v for k, v in b.items()})
            if args.compare_remote_audit:  # the same part again, on the code before audit writes were local
                b = await parked_part(client, temporal, tmp, args.parked[0], args, remote_audit=True)
                result.update({f"remote_audit_{k}": v for k, v in b.items()})
            if args.compare_unsandboxed:  # the same part again, workflow code outside Temporal's sandbox
                b = await parked_part(client, temporal, tmp, args.parked[0], args, unsandboxed=True)
                result.update({f"unsandboxed_{k}": v for k, v in b.items()})
    return {
        **result,
        "workflow_cache": args.workflow_cache or "temporalio's default (1000)",
        "daedalus_source": str(Path(daedalus.__file__).parents[2]),
        "temporal_store": "dev server, in memory" if args.in_memory else "dev server on a SQLite file",
    }


def show(result: dict[str, Any], parked: list[int]) -> None:
    table = Table(title="TicketWorkflow lifecycle benchmark (fake instant host activities)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("goal")
    table.add_row(
        "activities per ticket (host queue, local)",
        f"{result['activities_per_ticket']} ({result['host_activities_per_ticket']}, "
        f"{result['local_activities_per_ticket']})",
        "",
    )
    table.add_row(
        "tickets / bare workflows", f"{result['tickets']} each in {result['rounds']} interleaved rounds", ""
    )
    table.add_row(
        "ticket lifecycles / bare workflows, total s",
        f"{result['ticket_s']:.2f} / {result['bare_s']:.2f}",
        "",
    )
    table.add_row("overhead ratio (ticket / bare)", f"{result['overhead_ratio']:.3f}x", "<= 1.3x")
    table.add_row("per-round ratios", " ".join(f"{r:.2f}" for r in result["round_ratios"]), "")
    parts: list[tuple[str, dict[str, Any]]] = [(f"{parked[0]} parked", result)]
    parts += [
        (
            f"{count} parked",
            {k.removesuffix(f"_{count}"): v for k, v in result.items() if k.endswith(f"_{count}")},
        )
        for count in parked[1:]
    ]
    for prefix, what in (
        ("remote_audit_", "audit events as remote activities (before)"),
        ("unsandboxed_", "workflow code outside the sandbox"),
    ):
        if f"{prefix}parked_tickets" in result:
            again = {k.removeprefix(prefix): v for k, v in result.items() if k.startswith(prefix)}
            parts.append((f"{parked[0]} parked, {what}", again))
    for title, r in parts:
        rows = [
            ("filed in / all parked in, s", f"{r['file_s']} / {r['all_parked_s']}", ""),
            (
                "worker RSS before / parked, MB",
                f"{r['worker_rss_before_mb']} / {r['parked_worker_rss_mb']}",
                "",
            ),
            ("RSS per parked ticket, KB", f"{r['rss_per_parked_ticket_kb']}", ""),
            (
                "decide one at a time p50 / p99 (its 90% interval) / max, ms",
                f"{r['decide_p50_ms']} / {r['decide_p99_ms']} {shown(r['decide_p99_ci90_ms'])} / "
                f"{r['decide_max_ms']}",
                "p99 <= 100 ms",
            ),
            (
                "  send -> decision recorded p50 / p99, ms",
                f"{r['spaced_recorded_p50_ms']} / {r['spaced_recorded_p99_ms']}",
                "",
            ),
            (
                "decide back to back p50 / p99 (its 90% interval), ms",
                f"{r['decide_back_to_back_p50_ms']} / {r['decide_back_to_back_p99_ms']} "
                f"{shown(r['decide_back_to_back_p99_ci90_ms'])}",
                "p99 <= 100 ms",
            ),
            (
                "  send->scheduled / queued / worker / ->client, p50 ms",
                f"{r['b2b_to_scheduled_p50_ms']} / {r['b2b_queued_p50_ms']} / {r['b2b_worker_p50_ms']} / "
                f"{r['b2b_to_client_p50_ms']}",
                "",
            ),
            (
                "  send -> decision recorded p50 / p99, ms",
                f"{r['b2b_recorded_p50_ms']} / {r['b2b_recorded_p99_ms']}",
                "",
            ),
            ("  workflow tasks after the decide", f"{r['b2b_workflow_tasks_after_decide']}", ""),
            (
                f"  CPU share: {r['control_workers']} control worker(s) / host worker / temporal / client",
                f"{r['b2b_cpu_share_worker']} / {r['b2b_cpu_share_hosts']} / {r['b2b_cpu_share_temporal']}"
                f" / {r['b2b_cpu_share_client']}",
                "",
            ),
            (
                "control worker full collections parking / deciding; longest pause deciding, ms",
                f"{r['full_collections_parking']} / {r['full_collections_deciding']}; "
                f"{r['longest_collection_ms_deciding']}",
                "",
            ),
            ("load average before / after", f"{r['load_average_before']} / {r['load_average_after']}", ""),
        ]
        table.add_section()
        table.add_row(f"[bold]{title}[/bold]", "", "")
        for row in rows:
            table.add_row(*row)
    Console(width=140).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tickets", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--parked", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument(
        "--decides",
        type=int,
        default=1000,
        help="decide updates timed, spread over the parked, half one at a time and half back to back (a p99 "
        "needs 299 samples or more for its 90%% interval to have an upper bound)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--in-memory", action="store_true", help="dev server without its SQLite file")
    parser.add_argument(
        "--workflow-cache",
        type=int,
        help="the control worker's workflow cache (default: its setting's default)",
    )
    parser.add_argument(
        "--control-workers",
        type=int,
        default=1,
        help="control worker processes in part (b), as `daedalus worker --control` run that many times",
    )
    parser.add_argument("--worker", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--host-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--unsandboxed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--compare-unsandboxed",
        action="store_true",
        help="run the first parked count again with workflow code outside Temporal's sandbox "
        "(DAEDALUS_TEMPORAL_SANDBOX=false), on the same server: keys unsandboxed_*",
    )
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument(
        "--remote-audit", action="store_true", help=argparse.SUPPRESS
    )  # the worker leaves the audit-local-activity patch off
    parser.add_argument(
        "--compare-remote-audit",
        action="store_true",
        help="run the first parked count again with audit events as remote activities (the code before "
        "the audit-local-activity patch), on the same server: keys remote_audit_*",
    )
    arguments = parser.parse_args()
    if arguments.worker:
        asyncio.run(
            run_worker(
                arguments.worker,
                arguments.store,
                arguments.workflow_cache,
                arguments.remote_audit,
                arguments.host_worker,
                arguments.unsandboxed,
            )
        )
        raise SystemExit(0)
    recording = Recording.start()
    outcome = asyncio.run(main(arguments))
    recording.write(outcome, arguments.results)
    show(outcome, arguments.parked)
