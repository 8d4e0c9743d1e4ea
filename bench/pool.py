"""The GPU pool under contention, every part its own process: the embedded Temporal, the control worker, the
API, and three host workers. On host pool-a (4 simulated GPUs, a render-queue tenant on GPUs 2-3) tickets'
gates, an A/B pair, a training run and the tenant contend for the same GPUs; the pool-a worker is SIGKILLed
while one of its steps holds a lease, and a fresh one is started. Most steps are `LeasedStepWorkflow` ->
`run_leased` on the host's queue -> the host's `LeaseKeeperWorkflow`; besides them, real tickets filed through
the API run their gates under leases from the same keepers (`TicketWorkflow` -> `acquire_lease` -> `run_gate`),
and their verdicts name the lease each ran under.

Usage: .venv/bin/python bench/pool.py [--quick] [--out bench/results/pool.json]
Figures:
  overlapping_gpu_leases  pairs of jobs that ran at the same time on one GPU, from the jobs' own start/end log
  lease_grant_p50/p99_ms  hand-off: from the moment the GPUs were free for a step (its acquire call, or the
                          previous holder's release) to the step seeing its grant; client-side wall clock
  lease_wait_p50/p99_ms   acquire call -> grant seen, queueing behind other holders included
  tenant_pauses/resumes   the keeper's counts on pool-a; expired_leases_recovered: expired leases whose GPUs
                          were granted again afterwards; steps_run: steps whose command ran to the end
  ticket_gates_*          the tickets' gates: run, and recorded with the lease they ran under (verdicts)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console
from rich.table import Table
from temporalio.client import Client, WorkflowHandle

from daedalus.devserver import DevServer
from daedalus.hosts import holder
from daedalus.hosts.leases import (
    KeeperEventKind,
    KeeperState,
    LeasedCommand,
    LeasedRun,
    LeaseRequest,
    TenantMode,
)
from daedalus.ids import host_queue
from daedalus.payloads import DATA_CONVERTER
from daedalus.ports import free_port
from daedalus.store import tokens as api_tokens
from daedalus.store.database import make_engine, migrate
from daedalus.workflows.leased_step import LeasedStepWorkflow
from record import Recording

ROOT = Path(__file__).resolve().parents[1]
RENDER_QUEUE = ROOT / "tests" / "fixtures" / "render_queue.py"
GPU_JOB = ROOT / "bench" / "gpu_job.py"
DAEDALUS = str(Path(sys.executable).parent / "daedalus")
HOSTS = ["pool-a", "pool-b", "pool-c"]
CONTROL_QUEUE = "pool-control"
BENCH_TOKEN = "dtk_0000be0c_" + "b" * 43
"""The API token the scenario calls with; its hash goes into the pool's store."""


def registry(tmp: Path) -> dict[str, Any]:
    pidfile = tmp / "render-queue.pid"
    start = (
        f"[ -s {pidfile} ] && kill -0 $(cat {pidfile}) 2>/dev/null && exit 0; "
        f"nohup {sys.executable} {RENDER_QUEUE} --gpus 2,3 --mib 6000 --pidfile {pidfile} "
        f">> {tmp / 'render-queue.log'} 2>&1 & "
        f"for i in $(seq 200); do [ -s {pidfile} ] && exit 0; sleep 0.05; done; exit 1"
    )
    simulated = {"model": "simulated", "memory_gib": 8, "simulated": True}
    return {
        "hosts": [
            {
                "name": "pool-a",
                "gpus": {"count": 4, **simulated},
                "tenants": [
                    {
                        "name": "render",
                        "gpus": [2, 3],
                        "priority": 60,
                        "pause": f"[ -s {pidfile} ] && kill -TERM $(cat {pidfile}) || true",
                        "resume": start,
                        "free_below_mib": 512,
                        "free_timeout_s": 20,
                    }
                ],
            },
            {"name": "pool-b", "gpus": {"count": 2, **simulated}},
            {"name": "pool-c", "gpus": {"count": 1, **simulated}},
        ]
    }


class Pool:
    """The processes, started and stopped together."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = {
            **os.environ,
            "DAEDALUS_HOME": str(tmp / "home"),
            "DAEDALUS_HOSTS_FILE": str(tmp / "hosts.yaml"),
            "DAEDALUS_CONTROL_QUEUE": CONTROL_QUEUE,
            # the tickets' gates run confined: they may read (not write) the bench's GPU job
            "DAEDALUS_STEPS_READ_ONLY": json.dumps([str(ROOT / "bench")]),
        }
        store = make_engine(f"sqlite:///{tmp / 'home' / 'daedalus.db'}")
        migrate(store)
        api_tokens.add(store, "lead", BENCH_TOKEN, created_by="bench")
        store.dispose()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.server: DevServer | None = None
        self.api_port = free_port()

    def start(self, name: str, *args: str) -> None:
        log = (self.tmp / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            [DAEDALUS, *args], env=self.env, stdout=log, stderr=log, start_new_session=True
        )

    def kill(self, name: str) -> None:
        """SIGKILL, as a crashed host would: no shutdown, no release."""
        process = self.processes.pop(name)
        process.kill()
        process.wait(10)

    @contextmanager
    def running(self) -> Iterator[Pool]:
        (self.tmp / "hosts.yaml").write_text(yaml.safe_dump(registry(self.tmp)))
        self.server = DevServer(
            db_file=self.tmp / "temporal.db", port=free_port(), ui_port=None, die_with_parent=True
        )
        self.server.start()
        self.env["DAEDALUS_TEMPORAL_ADDRESS"] = self.server.address
        try:
            self.start("control", "worker", "--control")
            self.start("api", "api", "serve", "--port", str(self.api_port))
            for host in HOSTS:
                self.start(f"worker-{host}", "worker", "--host", host)
            yield self
        finally:
            for process in self.processes.values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGINT)
            for process in self.processes.values():
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
            self.server.stop()


def start_tenant(tmp: Path) -> None:
    resume = registry(tmp)["hosts"][0]["tenants"][0]["resume"]
    env = {**os.environ, "DAEDALUS_GPU_STATE_DIR": str(tmp / "home" / "hosts" / "pool-a" / "gpus")}
    subprocess.run(["sh", "-c", resume], env=env, check=True)


async def wait_for(what: str, check: Any, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = await check()
            if result:
                return result
        except Exception as error:  # not up yet: keep asking until the deadline
            last = error
        else:
            last = None
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout_s:g}s ({last})")
        await asyncio.sleep(0.3)


class Steps:
    def __init__(self, client: Client, ledger: Path) -> None:
        self.client = client
        self.ledger = ledger
        self.handles: list[tuple[str, WorkflowHandle[Any, LeasedRun]]] = []
        self.host_of: dict[str, str] = {}
        self.counter = itertools.count()

    async def submit(self, host: str, kind: str, seconds: float, *, ttl_s: float = 30, **request: Any) -> str:
        lease_id = f"{kind}-{next(self.counter)}"
        step = LeasedCommand(
            host=host,
            task_queue=host_queue(host),
            request=LeaseRequest(
                lease_id=lease_id, holder=f"bench {kind}", purpose=kind, ttl_s=ttl_s, **request
            ),
            command=f"exec {sys.executable} {GPU_JOB} --seconds {seconds} --ledger {self.ledger}",
            timeout_s=seconds + 60,
            wait_s=600,
            heartbeat_s=max(3.0, ttl_s),
        )
        handle = await self.client.start_workflow(
            LeasedStepWorkflow.run,
            step,
            id=f"step-{lease_id}-{uuid.uuid4().hex[:6]}",
            task_queue=CONTROL_QUEUE,
        )
        self.handles.append((lease_id, handle))
        self.host_of[lease_id] = host
        return lease_id

    def started(self, lease_id: str) -> bool:
        if not self.ledger.exists():
            return False
        return any(
            json.loads(line)["lease"] == lease_id and json.loads(line)["event"] == "start"
            for line in self.ledger.read_text().splitlines()
        )


def overlaps(ledger: Path, host_of: dict[str, str]) -> tuple[int, int]:
    """(pairs of jobs on one GPU of one host at once, jobs) from the jobs' own log; a job with no end counts as
    still running."""
    spans: dict[tuple[str, int], dict[str, Any]] = {}
    for line in ledger.read_text().splitlines():
        entry = json.loads(line)
        key = (entry["lease"], entry["pid"])
        span = spans.setdefault(
            key,
            {"host": host_of[entry["lease"]], "gpus": entry["gpus"], "start": None, "end": float("inf")},
        )
        span[entry["event"]] = entry["t"]
    count = 0
    jobs = list(spans.values())
    for a, b in itertools.combinations(jobs, 2):
        same_gpu = a["host"] == b["host"] and set(a["gpus"]) & set(b["gpus"])
        if same_gpu and a["start"] < b["end"] and b["start"] < a["end"]:
            count += 1
    return count, len(jobs)


def handoffs(runs: list[LeasedRun], states: dict[str, KeeperState]) -> tuple[list[float], list[float]]:
    """(hand-off ms, wait ms) per granted run; see the module docstring. A GPU becomes free when its holder
    released it (the holder's clock) or when the keeper expired a dead holder's lease (the keeper's clock)."""
    freed: list[tuple[str, set[int], datetime]] = [
        (host, set(e.gpus), e.at)
        for host, state in states.items()
        for e in state.events
        if e.kind is KeeperEventKind.EXPIRED
    ]
    granted = [r for r in runs if r.lease is not None and r.granted_seen is not None]
    for run in granted:
        if run.lease is not None and run.released_at is not None:
            freed.append((run.lease.host, set(run.lease.gpus), run.released_at))
    hand, wait = [], []
    for run in granted:
        assert run.lease is not None and run.granted_seen is not None
        free_at = max(
            [run.acquire_started]
            + [
                at
                for host, gpus, at in freed
                if host == run.lease.host and gpus & set(run.lease.gpus) and at < run.granted_seen
            ]
        )
        hand.append((run.granted_seen - free_at).total_seconds() * 1000)
        wait.append((run.granted_seen - run.acquire_started).total_seconds() * 1000)
    return hand, wait


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def recovered(state: KeeperState) -> int:
    """Expired leases whose GPUs were granted to a holder afterwards."""
    count = 0
    for i, event in enumerate(state.events):
        if event.kind is KeeperEventKind.EXPIRED and any(
            later.kind is KeeperEventKind.GRANTED and set(later.gpus) & set(event.gpus)
            for later in state.events[i + 1 :]
        ):
            count += 1
    return count


TICKET_HOSTS = ["pool-a", "pool-b"]


GATE_LEDGER = "gpu-jobs.jsonl"
"""A ticket's gate runs confined: it logs its job in its own checkout, gathered from there after the run."""


def ticket_body(host: str) -> dict[str, Any]:
    """An agent-less ticket whose one gate runs a GPU job under its lease and judges the work the job measured
    (its loops per second in 7 slices; the GPUs are simulated, the work is a CPU loop): it passes when the job
    really ran its time under the lease, and is INVALID when it did not."""
    command = f"{sys.executable} {GPU_JOB} --seconds 0.35 --ledger {GATE_LEDGER} --measure"
    return {
        "id": f"pool-{host}-{uuid.uuid4().hex[:6]}",
        "title": f"a job on {host} measured under a lease",
        "host": host,
        "gates": [{"name": "job", "metric": "decode_tps", "threshold": 1, "command": command}],
    }


def gather_gate_ledgers(tmp: Path, ledger: Path) -> int:
    """The tickets' gates' job logs, from their checkouts, into the pool's ledger; how many jobs started."""
    started = 0
    with ledger.open("a") as out:
        for found in sorted(tmp.rglob(GATE_LEDGER)):
            text = found.read_text()
            started += sum(json.loads(line)["event"] == "start" for line in text.splitlines())
            out.write(text)
    return started


async def file_tickets(api: httpx.AsyncClient, headers: dict[str, str]) -> list[str]:
    filed = []
    for host in TICKET_HOSTS:
        for _ in range(2):
            body = ticket_body(host)
            response = await api.post("/tickets", json=body, headers=headers)
            response.raise_for_status()
            filed.append(body["id"])
    return filed


async def ticket_leases(
    api: httpx.AsyncClient, headers: dict[str, str], tickets: list[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """(the verdicts of the tickets' gates, their closed statuses) once every ticket has closed."""

    async def closed() -> list[dict[str, Any]] | None:
        details = [(await api.get(f"/tickets/{t}", headers=headers)).json() for t in tickets]
        done = all(d.get("live") and d["live"]["status"] not in OPEN_STATUSES for d in details)
        return details if done else None

    details = await wait_for("the tickets to close", closed, 600)
    verdicts = [v for d in details for v in d["verdicts"]]
    return verdicts, [d["live"]["status"] for d in details]


OPEN_STATUSES = {"draft", "dispatched", "building", "gating", "awaiting_decision", "awaiting_approval"}


async def scenario(pool: Pool, quick: bool) -> dict[str, Any]:
    assert pool.server is not None
    client = await Client.connect(pool.server.address, data_converter=DATA_CONVERTER)
    for host in HOSTS:
        await wait_for(f"lease keeper {host}", lambda host=host: holder.keeper_state(client, host))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{pool.api_port}") as api:
        headers = {"Authorization": f"Bearer {BENCH_TOKEN}"}
        await wait_for("the API", lambda: _ok(api.get("/tickets", headers=headers)))
    start_tenant(pool.tmp)
    ledger = pool.tmp / "ledger.jsonl"
    steps = Steps(client, ledger)
    api = httpx.AsyncClient(base_url=f"http://127.0.0.1:{pool.api_port}", timeout=30)
    headers = {"Authorization": f"Bearer {BENCH_TOKEN}"}
    gates = 6 if quick else 24
    rounds = 2 if quick else 4
    # The victim: a step on GPU 1 whose worker is SIGKILLed while it runs (short ttl so the lease expires soon;
    # killed once the keeper has its first keepalive, after which the ttl, not the one-minute grace, applies).
    victim = await steps.submit("pool-a", "victim", 3.0, gpus=[1], ttl_s=5)
    await wait_for("the victim step to start", lambda: _async(steps.started(victim)), 120)

    async def victim_confirmed() -> bool:
        state = await holder.keeper_state(client, "pool-a")
        return any(lease.lease_id == victim and lease.confirmed for lease in state.held)

    await wait_for("the victim's first keepalive", victim_confirmed, 60)
    tickets = await file_tickets(api, headers)
    pool.kill("worker-pool-a")
    killed_at = datetime.now().astimezone()
    for i in range(gates):  # tickets' gates, one GPU each, some by index, some "any one"
        request = {"gpus": [i % 2]} if i % 3 else {"count": 1}
        await steps.submit("pool-a", "gate", 0.3, priority=50, **request)
    for _ in range(rounds):  # an A/B pair: candidate and baseline interleaved on the same two GPUs
        await steps.submit("pool-a", "ab-candidate", 0.4, gpus=[0, 1], priority=70)
        await steps.submit("pool-a", "ab-baseline", 0.4, gpus=[0, 1], priority=70)
    training = await steps.submit("pool-a", "training", 30.0, gpus=[2, 3], priority=30)
    for host, gpus in (("pool-b", 2), ("pool-c", 1)):
        for _ in range(gates // 2):
            await steps.submit(host, "gate", 0.2, count=1 if gpus == 1 else 2)
    await asyncio.sleep(1.0)
    pool.start("worker-pool-a-restarted", "worker", "--host", "pool-a")
    # The render queue's own work arrives while the training run holds its GPUs: the training lease (priority
    # 30 < 60) is revoked; the tenant's work ends a little later.
    await wait_for("the training step to start", lambda: _async(steps.started(training)), 300)
    revoked = await holder.tenant_demand(client, "pool-a", "render", busy=True)
    await asyncio.sleep(1.0)
    await holder.tenant_demand(client, "pool-a", "render", busy=False)
    runs: list[LeasedRun] = []
    for _, handle in steps.handles:
        runs.append(await asyncio.wait_for(handle.result(), 600))
    verdicts, ticket_statuses = await ticket_leases(api, headers, tickets)
    await api.aclose()
    for verdict in verdicts:
        if verdict["lease"]:
            steps.host_of[verdict["lease"]["lease_id"]] = verdict["lease"]["host"]

    async def settled() -> KeeperState | None:
        state = await holder.keeper_state(client, "pool-a")
        tenant = state.tenants[0]
        quiet = not state.held and not state.waiting and tenant.mode is TenantMode.RUNNING
        return state if quiet else None

    states = {host: await holder.keeper_state(client, host) for host in HOSTS}
    states["pool-a"] = await wait_for("pool-a to settle", settled, 120)
    gate_jobs = gather_gate_ledgers(pool.tmp, ledger)
    overlap, jobs = overlaps(ledger, steps.host_of)
    hand, wait = handoffs(runs, states)
    tenant = states["pool-a"].counters
    return {
        "overlapping_gpu_leases": overlap,
        "lease_grant_p50_ms": round(percentile(hand, 0.5), 1),
        "lease_grant_p99_ms": round(percentile(hand, 0.99), 1),
        "lease_wait_p50_ms": round(percentile(wait, 0.5), 1),
        "lease_wait_p99_ms": round(percentile(wait, 0.99), 1),
        "tenant_pauses": tenant.tenant_pauses,
        "tenant_resumes": tenant.tenant_resumes,
        "expired_leases_recovered": sum(recovered(s) for s in states.values()),
        "expired_leases": sum(s.counters.expired for s in states.values()),
        "steps_run": sum(1 for r in runs if r.returncode == 0),
        "steps_submitted": len(runs),
        "steps_revoked": sum(1 for r in runs if r.lost),
        "steps_refused": sum(1 for r in runs if r.refused),
        "revoked_by_tenant": revoked,
        "lost": [r.lost for r in runs if r.lost],
        "refused": [r.refused for r in runs if r.refused],
        "jobs_logged": jobs,
        "leases_granted": sum(s.counters.granted for s in states.values()),
        "ticket_gates_run": len(verdicts),
        "ticket_gates_under_lease": sum(1 for v in verdicts if v["lease"]),
        "tickets_passed": ticket_statuses.count("passed"),
        "tickets_filed": len(tickets),
        "gate_jobs_logged": gate_jobs,
        "hosts": len(HOSTS),
        "processes": ["temporal", *sorted(pool.processes), "worker-pool-a (SIGKILLed)"],
        "worker_killed_at": killed_at.isoformat(),
        "quick": quick,
        "cpu_count": os.cpu_count(),
        "grants_measured": len(hand),
    }


async def _ok(request: Any) -> bool:
    response = await request
    return bool(response.status_code == 200)


async def _async(value: bool) -> bool:
    return value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer steps (the test runs this)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pool.json")
    args = parser.parse_args()
    recording = Recording.start()
    with tempfile.TemporaryDirectory(prefix="daedalus-pool-") as tmp, Pool(Path(tmp)).running() as pool:
        try:
            result = asyncio.run(scenario(pool, args.quick))
        finally:
            with contextlib.suppress(OSError, ValueError):
                pid = int((Path(tmp) / "render-queue.pid").read_text())
                os.kill(pid, signal.SIGKILL)
    recording.write(result, args.out)
    table = Table(title="GPU pool: 3 hosts, 6 processes, contending leases")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if key not in ("processes", "revoked_by_tenant", "lost", "refused"):
            table.add_row(key, str(value))
    Console().print(table)


if __name__ == "__main__":
    main()
