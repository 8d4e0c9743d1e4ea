"""Chaos: tickets, a training run and decisions while workers are SIGKILLed and Temporal is restarted.

Every part is its own process, as in production: the embedded Temporal (a SQLite file, so a restart keeps its
state), the control worker, two host workers for one host, and the API. The bench files a stream of tickets
whose outcome is known from their inputs (pass, fail, build failure, escalate -> retry -> pass, an
inconclusive gate accepted / stopped / closed under exception, a rejected dispatch, gate-only tickets (one on
a real llama.cpp server when the engine is built), an umbrella with children) and one training run, and a
decider answers every request through the HTTP API (retried on errors; each answer carries its own id in its
note). Meanwhile, at seeded random moments, it SIGKILLs a host worker, the control worker or the API
(restarted a few seconds later) or SIGKILLs and restarts Temporal.

Usage: .venv/bin/python bench/chaos.py [--store sqlite|postgres] [--tickets 24] [--faults 32] [--window-s 300]
                                        [--seed 11] [--out bench/results/chaos.json]
Figures (from the store and Temporal once every ticket closed, or the settle timeout ran out):
  faults            SIGKILLs of host/control workers and the API plus Temporal restarts, injected while work ran
  tickets           tickets filed, children included; tickets_closed: closed in Temporal and in the store
  wrong_outcomes    closed tickets whose status (Temporal's result or the store's row) is not the one their
                    inputs imply, plus a training run that did not finish
  audit_gaps        sequence numbers missing from a trail (1..the workflow's final audit_seq), per trail
  audit_duplicates  sequence numbers present twice in a trail
  audit_chain_ok    `daedalus audit verify` exits 0
  duplicate_starts  agents started twice for one attempt (the scripted agent's own start log), trainers
                    started twice for one incarnation (the trainer's own start log)
  orphan_processes  processes left alive carrying a step token (DAEDALUS_STEP_TOKEN) of this run, and
                    trainer keepers left alive, once everything closed
  decisions_sent    distinct answers the decider sent (each retried until it is seen applied)
  decisions_applied answers found exactly once: one `decided` event for their request in the store, the
                    store's decision row carrying their id, and one entry in the workflow's own decisions
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine, text
from sqlmodel import col, select
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from daedalus import services
from daedalus.config import Settings
from daedalus.devserver import DevServer
from daedalus.engines import paths
from daedalus.engines.llama_build import cached_build
from daedalus.hosts.registry import Registry, load_registry
from daedalus.ids import ticket_workflow_id
from daedalus.ports import free_port
from daedalus.processes import STEP_TOKEN_ENV
from daedalus.schemas.ticket import TicketSpec, TicketState, TicketStatus
from daedalus.schemas.training import RunState, TrainingRunSpec, TrainingRunStatus
from daedalus.store.database import make_engine, session_scope
from daedalus.store.tables import AuditEventRow, DecisionRow, TicketRow
from daedalus.workflows.ticket import TicketWorkflow
from daedalus.workflows.training import TrainingRunWorkflow

ROOT = Path(__file__).resolve().parents[1]
EMIT = ROOT / "tests" / "fixtures" / "emit_samples.py"
TRAINER = ROOT / "tests" / "fixtures" / "trainer.py"
DAEDALUS = str(Path(sys.executable).parent / "daedalus")
POSTGRES_URL = os.environ.get(
    "DAEDALUS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
HOST = "chaos"
HOST_WORKERS = ("host-1", "host-2")
CONTROL_QUEUE = "chaos-control"
TOKEN = "chaos-token"
DECIDER = "wayne"
TRAINING_RUN = "chaos-train"
NOTE_PREFIX = "chaos-decision "


# ---- what is filed, and what each filing must end as -------------------------------------------------


@dataclass(frozen=True)
class Design:
    """A kind of ticket: how the decider answers it, and the outcome that implies (whatever the faults)."""

    name: str
    expected: TicketStatus
    dispatch: str = "approve"
    escalation: str = "retry"
    """The answer to every escalation; faults (a lost attempt, an INVALID gate) may add escalations, and the
    answer keeps the outcome: retry tickets still pass, fail tickets still fail."""


DESIGNS = {
    d.name: d
    for d in (
        Design("pass", TicketStatus.PASSED),
        Design("fail", TicketStatus.FAILED, escalation="fail"),
        Design("build-fail", TicketStatus.FAILED, escalation="fail"),
        Design("retry-pass", TicketStatus.PASSED),
        Design("reject", TicketStatus.CANCELLED, dispatch="reject"),
        Design("accept", TicketStatus.PASSED, escalation="accept"),
        Design("stop", TicketStatus.STOPPED_BY_RULES, escalation="stop"),
        Design("exception", TicketStatus.CLOSED_UNDER_EXCEPTION, escalation="close-under-exception"),
        Design("gate-only", TicketStatus.PASSED),
        Design("llama", TicketStatus.PASSED),
        Design("umbrella", TicketStatus.PASSED),
    )
}
ROTATION = [
    "pass", "retry-pass", "fail", "umbrella", "reject", "accept", "build-fail",
    "gate-only", "stop", "pass", "exception", "llama", "retry-pass", "pass",
]  # fmt: skip


def gate(threshold: float, extra: str = "", name: str = "decode") -> dict[str, Any]:
    return {
        "name": name,
        "metric": "decode_tps",
        "threshold": threshold,
        "command": f"{sys.executable} {EMIT} speed.txt {extra}".strip(),
        "timeout_s": 120,
    }


def set_speed(value: str) -> str:
    return f"echo {value} > speed.txt"


class Tickets:
    """Ticket specs by design; the scripted agent logs every start (its worktree names ticket and attempt)."""

    def __init__(self, repo: Path, starts: Path, llama: bool) -> None:
        self.repo = repo
        self.starts = starts
        self.llama = llama

    def agent(self, *commands: str) -> dict[str, Any]:
        logged = f'echo "$PWD" >> {self.starts / "agent-starts.log"}'
        return {"name": "scripted", "commands": [logged, "sleep 1", *commands]}

    def spec(self, ticket_id: str, design: str) -> dict[str, Any]:
        base: dict[str, Any] = {
            "id": ticket_id,
            "title": f"chaos {design}",
            "engine": {"name": "toy", "kind": "repo", "repo": str(self.repo), "base_commit": "main"},
            "host": HOST,
            "spec": f"chaos ticket ({design})",
            "build": {"command": "test -f speed.txt", "timeout_s": 120},
            "gates": [gate(55)],
            "approval": {"dispatch_requires_approval": True, "deciders": [DECIDER]},
            "max_attempts": 3,
        }
        match design:
            case "pass":
                base["agent"] = self.agent(set_speed("56.0"))
            case "fail":
                base.update(agent=self.agent(set_speed("40.0")), max_attempts=2)
            case "build-fail":
                base.update(
                    agent=self.agent(set_speed("56.0")),
                    build={"command": "echo 'error: no member named align_tax' >&2; exit 2"},
                    max_attempts=2,
                )
            case "retry-pass":  # attempt 1 is slow; every later attempt is fast
                speed = 'case "$PWD" in */attempt-1) echo 40.0 ;; *) echo 56.0 ;; esac > speed.txt'
                base.update(agent=self.agent(speed), max_attempts=1)
            case "reject":
                base["agent"] = self.agent(set_speed("56.0"))
            case "accept" | "stop" | "exception":  # samples straddle the threshold: INCONCLUSIVE, twice
                base.update(agent=self.agent(set_speed("56.0")), gates=[gate(56, "--jitter 0.5")])
            case "gate-only":
                base.update(build=None, gates=[gate(20)])
            case "llama":
                base.update(build=None, gates=[self.llama_gate()])
            case "umbrella":
                children = [self.spec(f"{ticket_id}-c{n}", "pass") for n in (1, 2)]
                children[1]["approval"] = {"dispatch_requires_approval": False, "deciders": [DECIDER]}
                base.update(
                    build=None, gates=[], children=children, approval={"deciders": [DECIDER]}, kind="umbrella"
                )
            case _:
                raise ValueError(f"unknown design {design}")
        return base

    def llama_gate(self) -> dict[str, Any]:
        if not self.llama:  # no llama.cpp build cached here: a command gate stands in
            return gate(20, name="decode-llama-stand-in")
        return {
            "name": "decode-llama",
            "metric": "decode_tps",
            "threshold": 1,
            "command": f"{DAEDALUS} engine measure decode_tps --preset local-f16 --model small --rounds 5",
            "timeout_s": 300,
        }


def children_of(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [spec, *(c for child in spec.get("children", []) for c in children_of(child))]


# ---- the processes ----------------------------------------------------------------------------------


@dataclass
class Fault:
    at_s: float
    kind: str
    target: str


class Stack:
    """Temporal, the control worker, the host workers and the API, each its own process."""

    def __init__(self, tmp: Path, database_url: str) -> None:
        self.tmp = tmp
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.server = DevServer(
            db_file=tmp / "temporal.db", port=free_port(), ui_port=None, log_file=self.logs / "temporal.log"
        )
        self.api_port = free_port()
        self.env = {
            **os.environ,
            "DAEDALUS_HOME": str(tmp / "home"),
            "DAEDALUS_ARTIFACTS": str(tmp / "artifacts"),
            "DAEDALUS_HOSTS_FILE": str(tmp / "hosts.yaml"),
            "DAEDALUS_CONTROL_QUEUE": CONTROL_QUEUE,
            "DAEDALUS_API_TOKENS": json.dumps({TOKEN: DECIDER}),
            "DAEDALUS_DATABASE_URL": database_url,
            "DAEDALUS_TEMPORAL_ADDRESS": self.server.address,
            "DAEDALUS_AGENT_SANDBOX_WRITABLE": json.dumps([str(tmp / "starts")]),
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.commands = {
            "control": ["worker", "--control"],
            **{name: ["worker", "--host", HOST] for name in HOST_WORKERS},
            "api": ["api", "serve", "--port", str(self.api_port)],
        }
        self.unplanned_exits: list[str] = []

    def start(self, name: str) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            [DAEDALUS, *self.commands[name]], env=self.env, stdout=log, stderr=log, start_new_session=True
        )
        log.close()

    def sigkill(self, name: str) -> None:
        """SIGKILL the worker process alone, as a crash would: its steps' own sessions live on."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait(10)

    def restart_temporal(self) -> None:
        """SIGKILL the dev server (no shutdown at all) and start it again on the same file and port."""
        assert self.server.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server.process.pid, signal.SIGKILL)
        self.server.process.wait(10)
        deadline = time.monotonic() + 30
        while True:  # the port may linger a moment after the kill
            try:
                self.server.start()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def revive(self) -> None:
        """Start again any process that exited on its own (a worker that gave up while Temporal was down)."""
        for name, process in list(self.processes.items()):
            if process.poll() is not None:
                self.unplanned_exits.append(f"{name} exited {process.returncode}")
                self.start(name)

    def stop(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        self.server.stop()


class Faults:
    """At seeded random moments in the window: SIGKILL a host worker, the control worker or the API (restarted
    after a short seeded delay: the decider meets refused connections) or SIGKILL and restart Temporal."""

    KINDS = (("host", 0.4), ("control", 0.27), ("temporal", 0.23), ("api", 0.1))
    TARGETS = {"host": HOST_WORKERS, "control": ("control",), "api": ("api",)}

    def __init__(self, stack: Stack, rng: random.Random, count: int, window_s: float) -> None:
        self.stack = stack
        self.rng = rng
        self.times = sorted(rng.uniform(2, window_s) for _ in range(count))
        self.done: list[Fault] = []
        self.restarts: set[asyncio.Task[None]] = set()

    async def run(self, started: float) -> None:
        for at in self.times:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            kind = self.rng.choices([k for k, _ in self.KINDS], [w for _, w in self.KINDS])[0]
            if kind == "temporal":
                await asyncio.to_thread(self.stack.restart_temporal)
                self.done.append(Fault(round(time.monotonic() - started, 1), kind, "temporal"))
                continue
            alive = [n for n in self.TARGETS[kind] if n in self.stack.processes]
            if not alive:  # already down (killed a moment ago): kill another part instead
                await asyncio.to_thread(self.stack.restart_temporal)
                self.done.append(Fault(round(time.monotonic() - started, 1), "temporal", "temporal"))
                continue
            target = self.rng.choice(alive)
            await asyncio.to_thread(self.stack.sigkill, target)
            self.done.append(Fault(round(time.monotonic() - started, 1), kind, target))
            task = asyncio.create_task(self._restart_later(target, self.rng.uniform(0.5, 5.0)))
            self.restarts.add(task)
            task.add_done_callback(self.restarts.discard)
        await asyncio.gather(*self.restarts)

    async def _restart_later(self, name: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self.stack.start(name)


# ---- the decider: every request answered through the API, each answer with its own id ----------------


@dataclass
class Sent:
    decision_id: str
    request_id: str
    ticket_id: str
    option: str
    posts: int = 0
    statuses: list[int] = field(default_factory=list)
    confirmed: bool = False


class Decider:
    def __init__(self, api: httpx.AsyncClient, designs: dict[str, str], rng: random.Random) -> None:
        self.api = api
        self.designs = designs
        self.rng = rng
        self.sent: dict[str, Sent] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def option(self, request: dict[str, Any]) -> str:
        ticket = request["ticket_id"]
        if "restart" in request["options"]:  # a training run's escalation
            return "restart"
        design = DESIGNS[self.designs.get(ticket, "pass")]
        return design.dispatch if request["kind"] == "dispatch" else design.escalation

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                response = await self.api.get("/decisions", params={"pending": "true"})
                if response.status_code == 200:
                    for request in response.json():
                        if request["request_id"] not in self.sent:
                            self._answer(request)
            await asyncio.sleep(0.5)
        await asyncio.gather(*self.tasks)

    def _answer(self, request: dict[str, Any]) -> None:
        sent = Sent(
            decision_id=uuid.uuid4().hex[:12],
            request_id=request["request_id"],
            ticket_id=request["ticket_id"],
            option=self.option(request),
        )
        self.sent[sent.request_id] = sent
        task = asyncio.create_task(self._send(sent, delay_s=self.rng.uniform(0, 3)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send(self, sent: Sent, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        body = {
            "request_id": sent.request_id,
            "option": sent.option,
            "decided_by": DECIDER,
            "note": NOTE_PREFIX + sent.decision_id,
        }
        while not sent.confirmed:
            try:
                sent.posts += 1
                response = await self.api.post("/decisions", json=body, timeout=60)
                sent.statuses.append(response.status_code)
                if response.status_code == 200:
                    sent.confirmed = True
                    return
            except httpx.HTTPError:
                sent.statuses.append(0)  # connection error: the same answer again
            # Refused (409: not waiting, perhaps because this very answer landed), or Temporal was away:
            # look in the store; resend only while the request still waits and nobody answered it.
            row = await self._row(sent)
            if row is not None and row["decided_at"] is not None:
                sent.confirmed = row["note"] == body["note"]
                return
            await asyncio.sleep(1.0)

    async def _row(self, sent: Sent) -> dict[str, Any] | None:
        with contextlib.suppress(httpx.HTTPError):
            response = await self.api.get("/decisions", params={"ticket": sent.ticket_id})
            if response.status_code == 200:
                for row in response.json():
                    if row["request_id"] == sent.request_id:
                        return dict(row)
        return None


# ---- the run ----------------------------------------------------------------------------------------


def registry() -> dict[str, Any]:
    return {
        "hosts": [
            {
                "name": HOST,
                "gpus": {"count": 1, "model": "simulated", "memory_gib": 8, "simulated": True},
                "schedule_to_start_s": 600,
            }
        ]
    }


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "speed.txt").write_text("28.9\n")
    (path / "README").write_text("toy engine for the chaos bench\n")
    for command in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base"],
    ):
        subprocess.run(command, cwd=path, check=True)
    return path


def training_spec(tmp: Path, repo: Path, seconds: float) -> TrainingRunSpec:
    starts = tmp / "starts" / "trainer-starts.log"
    checkpoints = tmp / "checkpoints"
    steps = max(50, int(seconds / 0.1))
    script = (
        f'echo "$DAEDALUS_TRAINING_INCARNATION" >> {starts}; '
        f"exec {sys.executable} {TRAINER} --steps {steps} --step-s 0.1 --checkpoint-dir {checkpoints}"
    )
    return TrainingRunSpec.model_validate(
        {
            "name": TRAINING_RUN,
            "host": HOST,
            "command": ["sh", "-c", script],
            "cwd": str(tmp),
            "checkpoints": {"directory": str(checkpoints), "every_steps": 20, "keep": 2},
            "watchdog": {
                "memory_source": "process_tree",
                "budget_mib": 4000,
                "min_available_gib": 0.05,
                "sample_interval_s": 0.5,
                "slope_window_s": 60,
                "min_fit_span_s": 10,
                "checkpoint_grace_s": 10,
                "term_grace_s": 5,
                "report_interval_s": 5,
            },
            "restart": {"restart_delay_s": 1},
            "approval": {"deciders": [DECIDER]},
            "hunt": {"agent": "codex", "engine": {"name": "trainer", "kind": "repo", "repo": str(repo)}},
        }
    )


async def retrying(what: str, call: Any, timeout_s: float = 120) -> Any:
    """Call `call()` until Temporal answers (it may be restarting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except (RPCError, RuntimeError, services.TicketError) as error:
            if "already live" in str(error) or "already running" in str(error):
                return None  # an earlier try started it; its answer was lost
            transient = isinstance(error, RPCError | RuntimeError) or isinstance(error.__cause__, RPCError)
            if not transient or time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {error}") from error
            await asyncio.sleep(1.0)


async def file_all(
    client: Client,
    specs: list[TicketSpec],
    hosts: Registry,
    window_s: float,
    rng: random.Random,
    started: float,
) -> None:
    """File the tickets across the first 70% of the fault window, so work runs while faults land."""
    moments = sorted(rng.uniform(0, 0.7 * window_s) for _ in specs)
    for spec, at in zip(specs, moments, strict=True):
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        await retrying(
            f"filing {spec.id}",
            lambda spec=spec: services.file_ticket(
                client, spec, queue=CONTROL_QUEUE, filed_by="chaos", hosts=hosts
            ),
        )


async def closed_state(client: Client, ticket_id: str) -> TicketState | None:
    """The ticket's result once its workflow completed (None while it runs or when it never started)."""
    handle = client.get_workflow_handle_for(TicketWorkflow.run, ticket_workflow_id(ticket_id))
    try:
        description = await handle.describe()
        if description.status is WorkflowExecutionStatus.RUNNING:
            return None
        if description.status is WorkflowExecutionStatus.CONTINUED_AS_NEW:
            return None
        return await handle.result()
    except RPCError:
        return None
    except Exception as error:  # failed or terminated: no state to compare
        print(f"ticket {ticket_id}: workflow ended without a state: {error}")
        return None


async def settle(
    client: Client, ids: list[str], stack: Stack, timeout_s: float
) -> tuple[dict[str, TicketState], TrainingRunStatus | None]:
    deadline = time.monotonic() + timeout_s
    states: dict[str, TicketState] = {}
    training: TrainingRunStatus | None = None
    while time.monotonic() < deadline:
        stack.revive()
        for ticket_id in ids:
            if ticket_id not in states:
                with contextlib.suppress(RPCError):
                    state = await closed_state(client, ticket_id)
                    if state is not None:
                        states[ticket_id] = state
        if training is None:
            handle = client.get_workflow_handle_for(TrainingRunWorkflow.run, f"training-{TRAINING_RUN}")
            with contextlib.suppress(RPCError):
                if (await handle.describe()).status is WorkflowExecutionStatus.COMPLETED:
                    training = await handle.result()
        if len(states) == len(ids) and training is not None:
            break
        await asyncio.sleep(2.0)
    return states, training


# ---- the checks -------------------------------------------------------------------------------------


def audit_sequences(
    engine: Engine, subjects: list[str], final_seq: dict[str, int]
) -> tuple[int, int, list[str]]:
    """(gaps, duplicates, what) over every trail of `subjects`: one trail per (subject, first run id)."""
    with session_scope(engine) as session:
        rows = session.exec(select(AuditEventRow).where(col(AuditEventRow.ticket_id).in_(subjects))).all()
    trails: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        trails.setdefault((row.ticket_id, row.run_id), []).append(row.seq)
    gaps = duplicates = 0
    what: list[str] = []
    for (subject, run_id), seqs in trails.items():
        counts = Counter(seqs)
        top = max(max(seqs), final_seq.get(subject, 0))
        missing = [n for n in range(1, top + 1) if n not in counts]
        doubled = [n for n, c in counts.items() if c > 1]
        gaps += len(missing)
        duplicates += sum(counts[n] - 1 for n in doubled)
        if missing or doubled:
            what.append(f"{subject} ({run_id[:8]}): missing {missing}, doubled {doubled}")
    for subject in subjects:
        if not any(s == subject for s, _ in trails):
            gaps += final_seq.get(subject, 0)
            what.append(f"{subject}: no events in the store")
    return gaps, duplicates, what


def start_log(starts: Path, name: str) -> list[str]:
    path = starts / name
    return path.read_text().split() if path.exists() else []


def duplicate_starts(starts: Path) -> tuple[int, list[str]]:
    """Agents started twice for one attempt (worktree path) and trainers twice for one incarnation."""
    found: list[str] = []
    count = 0
    for log in ("agent-starts.log", "trainer-starts.log"):
        lines = start_log(starts, log)
        for key, n in Counter(lines).items():
            if n > 1:
                count += n - 1
                found.append(f"{Path(key).parent.name}/{Path(key).name} started {n} times")
    return count, found


def orphans(tmp: Path) -> list[str]:
    """Processes of this run still alive carrying a step token, or a trainer keeper of this run."""
    home = f"DAEDALUS_HOME={tmp / 'home'}".encode()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            with open(f"/proc/{proc.pid}/environ", "rb") as handle:
                environ = b"\0" + handle.read()
            stepped = f"\0{STEP_TOKEN_ENV}=".encode() in environ
            keeper = b"\0DAEDALUS_TRAINING_INCARNATION=" in environ
            ours = home in environ or str(proc.cwd()).startswith(str(tmp))
        except (OSError, psutil.Error):
            continue
        if (stepped or keeper) and ours:
            found.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or [])[:120]}")
    return found


def decisions_applied(
    engine: Engine, decider: Decider, states: dict[str, TicketState]
) -> tuple[int, list[str]]:
    """Answers applied exactly once, seen in the store's events and rows and in Temporal's own state."""
    with session_scope(engine) as session:
        decided = session.exec(select(AuditEventRow).where(AuditEventRow.kind == "decided")).all()
        rows = {r.request_id: r for r in session.exec(select(DecisionRow)).all()}
    events_per_request = Counter(e.detail.get("request") for e in decided)
    in_temporal: Counter[str] = Counter()
    for state in states.values():
        in_temporal.update(d.note for d in state.decisions)
    applied, problems = 0, []
    for sent in decider.sent.values():
        note = NOTE_PREFIX + sent.decision_id
        row = rows.get(sent.request_id)
        events = events_per_request[sent.request_id]
        # A training run's status does not list its answers: for its requests, the store is the witness.
        seen = 1 if sent.request_id.startswith("training-") else in_temporal[note]
        if events == 1 and row is not None and row.note == note and seen == 1:
            applied += 1
        else:
            problems.append(
                f"{sent.request_id} ({sent.option}, {sent.decision_id}): {events} decided events, "
                f"row note {row.note if row else None!r}, {seen}x in Temporal, posts {sent.statuses}"
            )
    return applied, problems


def audit_verify(env: dict[str, str]) -> bool:
    done = subprocess.run([DAEDALUS, "audit", "verify"], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:])
    return done.returncode == 0


# ---- main -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def store_url(store: str, tmp: Path) -> Any:
    if store == "sqlite":
        yield f"sqlite:///{tmp / 'store.db'}"
        return
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    admin = make_engine(POSTGRES_URL)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


async def scenario(args: argparse.Namespace, tmp: Path, stack: Stack, database_url: str) -> dict[str, Any]:
    rng = random.Random(args.seed)
    (tmp / "starts").mkdir()
    llama = cached_build(paths.default_llama_source()) is not None if args.llama else False
    tickets = Tickets(make_repo(tmp / "repo"), tmp / "starts", llama)
    designs: dict[str, str] = {}
    specs = []
    for n in range(args.tickets):
        design = ROTATION[n % len(ROTATION)]
        spec = tickets.spec(f"k{n:03d}-{design}", design)
        specs.append(TicketSpec.model_validate(spec))
        for child in children_of(spec):
            designs[child["id"]] = design if child is spec else "pass"
    client = await Client.connect(stack.server.address, data_converter=pydantic_data_converter)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.api_port}", headers=headers) as api:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await api.get("/tickets")).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the API did not answer within 120 s")
            await asyncio.sleep(0.5)
        decider = Decider(api, designs, random.Random(args.seed + 1))
        stop_deciding = asyncio.Event()
        deciding = asyncio.create_task(decider.run(stop_deciding))
        started = time.monotonic()
        spec = training_spec(tmp, tickets.repo, 0.6 * args.window_s)
        await retrying(
            "starting the training run", lambda: services.start_run(client, spec, queue=CONTROL_QUEUE)
        )
        faults = Faults(stack, random.Random(args.seed + 2), args.faults, args.window_s)
        await asyncio.gather(
            faults.run(started),
            file_all(client, specs, load_registry(tmp / "hosts.yaml"), args.window_s, rng, started),
        )
        window = time.monotonic() - started
        stack.revive()
        states, training = await settle(client, list(designs), stack, args.settle_timeout_s)
        settled = time.monotonic() - started - window
        await asyncio.sleep(3)  # the last answers' polls; steps end their process groups
        stop_deciding.set()
        await deciding
        leftover = orphans(tmp)
    engine = make_engine(database_url)
    try:
        with session_scope(engine) as session:
            rows = {r.ticket_id: r for r in session.exec(select(TicketRow)).all()}
        wrong = []
        for ticket_id, design in designs.items():
            state = states.get(ticket_id)
            row = rows.get(ticket_id)
            expected = DESIGNS[design].expected
            if state is None:
                continue  # counted as not closed
            if state.status is not expected or row is None or row.status != state.status.value:
                wrong.append(
                    f"{ticket_id}: expected {expected.value}, Temporal {state.status.value} "
                    f"({state.outcome_reason}), store {row.status if row else None}"
                )
        if training is None or training.state is not RunState.FINISHED:
            wrong.append(f"training run {TRAINING_RUN}: {training.state.value if training else 'not ended'}")
        closed = [
            t for t, s in states.items() if rows.get(t) is not None and rows[t].status == s.status.value
        ]
        not_closed = {t: rows[t].status if t in rows else "not in store" for t in designs if t not in states}
        final_seq = {t: s.audit_seq for t, s in states.items()}
        if training is not None:
            final_seq[f"training-{TRAINING_RUN}"] = training.audit_seq
        gaps, doubled, audit_problems = audit_sequences(
            engine, [*designs, f"training-{TRAINING_RUN}"], final_seq
        )
        starts, start_problems = duplicate_starts(tmp / "starts")
        applied, decision_problems = decisions_applied(engine, decider, states)
    finally:
        engine.dispose()
    return {
        "store": args.store,
        "faults": len(faults.done),
        "faults_by_kind": dict(Counter(f.kind for f in faults.done)),
        "tickets": len(designs),
        "tickets_closed": len(closed),
        "wrong_outcomes": len(wrong),
        "audit_gaps": gaps,
        "audit_duplicates": doubled,
        "audit_chain_ok": audit_verify(stack.env),
        "duplicate_starts": starts,
        "orphan_processes": len(leftover),
        "decisions_sent": len(decider.sent),
        "decisions_applied": applied,
        "decision_posts": sum(s.posts for s in decider.sent.values()),
        "agent_starts": len(start_log(tmp / "starts", "agent-starts.log")),
        "trainer_starts": len(start_log(tmp / "starts", "trainer-starts.log")),
        "attempt_outcomes": dict(Counter(a.outcome.value for st in states.values() for a in st.attempts)),
        "training_run": training.state.value if training else "not ended",
        "llama_gate": llama,
        "window_s": round(window, 1),
        "settle_s": round(settled, 1),
        "seed": args.seed,
        "designs": dict(Counter(designs.values())),
        "unplanned_exits": stack.unplanned_exits,
        "problems": {
            "not_closed": not_closed,
            "wrong_outcomes": wrong,
            "audit": audit_problems,
            "duplicate_starts": start_problems,
            "orphans": leftover,
            "decisions": decision_problems,
        },
        "fault_log": [asdict(f) for f in faults.done],
        "cpu_count": os.cpu_count(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    paths.configure(Settings.load().engines)
    with (
        tempfile.TemporaryDirectory(prefix="daedalus-chaos-") as name,
        store_url(args.store, Path(name)) as database_url,
    ):
        tmp = Path(name)
        (tmp / "hosts.yaml").write_text(yaml.safe_dump(registry()))
        stack = Stack(tmp, database_url)
        stack.server.start()
        try:
            for process in ("control", *HOST_WORKERS, "api"):
                stack.start(process)
            result = asyncio.run(scenario(args, tmp, stack, database_url))
        finally:
            stack.stop()
            for leftover in orphans(tmp):  # whatever the checks found is not left on the machine
                with contextlib.suppress(psutil.Error, ValueError):
                    psutil.Process(int(leftover.split()[0])).kill()
            if args.keep_logs is not None:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for log in (tmp / "logs").iterdir():
                    (args.keep_logs / log.name).write_bytes(log.read_bytes())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--tickets", type=int, default=24, help="top-level tickets filed (umbrellas add 2 each)"
    )
    parser.add_argument("--faults", type=int, default=32)
    parser.add_argument("--window-s", type=float, default=300, help="faults land and tickets are filed in it")
    parser.add_argument("--settle-timeout-s", type=float, default=420)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--no-llama", dest="llama", action="store_false", help="command gates only")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "chaos.json")
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy the processes' logs here")
    args = parser.parse_args()
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text_out = json.dumps(result, indent=2) + "\n"
    args.out.write_text(text_out)
    per_store = args.out.with_name(f"{args.out.stem}-{args.store}{args.out.suffix}")
    per_store.write_text(text_out)
    table = Table(title=f"chaos on {args.store}: {result['faults']} faults, {result['tickets']} tickets")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if key not in (
            "problems",
            "fault_log",
            "designs",
            "faults_by_kind",
            "unplanned_exits",
            "attempt_outcomes",
        ):
            table.add_row(key, str(value))
    Console().print(table)
    for key in ("faults_by_kind", "attempt_outcomes", "unplanned_exits"):
        print(f"{key}: {result[key]}")
    for kind, found in result["problems"].items():
        for line in found if isinstance(found, list) else [f"{k}: {v}" for k, v in found.items()]:
            print(f"{kind}: {line}")
    print(f"wrote {args.out} and {per_store}")


if __name__ == "__main__":
    main()
