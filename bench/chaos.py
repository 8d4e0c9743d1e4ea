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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml
from rich.console import Console
from rich.table import Table
from sqlalchemy import text
from sqlmodel import select
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from chaos_checks import (
    audit_sequences,
    audit_verify,
    decisions_applied,
    duplicate_starts,
    orphans,
    start_log,
)
from chaos_decider import DECIDER, Decider
from daedalus import services
from daedalus.config import Settings
from daedalus.devserver import DevServer
from daedalus.engines import paths
from daedalus.engines.llama_build import cached_build
from daedalus.hosts.registry import Registry, load_registry
from daedalus.ids import ticket_workflow_id
from daedalus.payloads import DATA_CONVERTER
from daedalus.ports import free_port
from daedalus.schemas.ticket import TicketSpec, TicketState, TicketStatus
from daedalus.schemas.training import RunState, TrainingRunSpec, TrainingRunStatus
from daedalus.store import tokens as api_tokens
from daedalus.store.database import make_engine, migrate, session_scope
from daedalus.store.tables import TicketRow
from daedalus.workflows.ticket import TicketWorkflow
from daedalus.workflows.training import TrainingRunWorkflow
from record import Recording

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
TOKEN = "dtk_000c4a05_" + "c" * 43
"""The decider's API token; its hash goes into the run's store."""
TRAINING_RUN = "chaos-train"


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


def answer(designs: dict[str, str], request: dict[str, Any]) -> str:
    """The decider's answer: by the design of the ticket that asks (a training run's escalation: restart)."""
    if "restart" in request["options"]:
        return "restart"
    design = DESIGNS[designs.get(request["ticket_id"], "pass")]
    return design.dispatch if request["kind"] == "dispatch" else design.escalation


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
            "DAEDALUS_DATABASE_URL": database_url,
            "DAEDALUS_TEMPORAL_ADDRESS": self.server.address,
            "DAEDALUS_AGENT_SANDBOX_WRITABLE": json.dumps([str(tmp / "starts")]),
            # Gates run confined: the command gates' script is readable in their sandbox (as tests/conftest.py
            # sets it for the suite); without it every gate fails and each ticket escalates on and on.
            "DAEDALUS_STEPS_READ_ONLY": json.dumps([str(EMIT.parent)]),
        }
        store = make_engine(database_url)
        migrate(store)
        api_tokens.add(store, DECIDER, TOKEN, created_by="bench")
        store.dispose()
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
        except (RPCError, RuntimeError, services.RequestRefused) as error:
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
    client = await Client.connect(stack.server.address, data_converter=DATA_CONVERTER)
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
        decider = Decider(api, lambda request: answer(designs, request), random.Random(args.seed + 1))
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
        applied, decision_problems = decisions_applied(engine, decider.sent.values(), states)
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
        "decision_post_statuses": dict(Counter(str(c) for s in decider.sent.values() for c in s.statuses)),
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
    recording = Recording.start()
    result = run(args)
    recording.write(result, args.out)
    per_store = args.out.with_name(f"{args.out.stem}-{args.store}{args.out.suffix}")
    per_store.write_text(args.out.read_text())
    table = Table(title=f"chaos on {args.store}: {result['faults']} faults, {result['tickets']} tickets")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if not isinstance(value, dict | list):  # the breakdowns and problems are printed below
            table.add_row(key, str(value))
    Console().print(table)
    for key in ("faults_by_kind", "attempt_outcomes", "decision_post_statuses", "unplanned_exits"):
        print(f"{key}: {result[key]}")
    for kind, found in result["problems"].items():
        for line in found if isinstance(found, list) else [f"{k}: {v}" for k, v in found.items()]:
            print(f"{kind}: {line}")
    print(f"wrote {args.out} and {per_store}")


if __name__ == "__main__":
    main()
