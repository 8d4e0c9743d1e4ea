"""Dispatch latency and supervision overhead of coding agents.

- dispatch_to_running: from the workflow start (the dispatch decision) to the agent's process running (inside its
  bubblewrap sandbox, so the sandbox's start is included), through
  a real Temporal dev server and worker: the scripted agent, a fake `codex` executable, and the OpenAI tool loop
  against a local OpenAI-protocol server (there: until its first request arrives).
- overhead per 1,000 events: a fake codex emits N JSONL events as fast as it can; the time Daedalus takes to
  supervise it (transcript, parsing, heartbeats) minus the time the same program takes writing to /dev/null.

Run: .venv/bin/python bench/dispatch.py [--runs 15] [--events 5000]
"""

from __future__ import annotations

import argparse
import asyncio
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

from rich.console import Console
from rich.table import Table
from temporalio.client import Client
from temporalio.worker import Worker

from daedalus.payloads import DATA_CONVERTER

ROOT = Path(__file__).resolve().parents[1]
MARKS = Path()
sys.path.insert(0, str(ROOT))

from tests.activities.test_attempts import AttemptProbe, Probe  # noqa: E402
from tests.agents.fakes import API_KEY, Script, Turn, fake_cli_settings, serve, write_fake_cli  # noqa: E402
from tests.support import make_engine_repo, ticket_spec  # noqa: E402

from daedalus.activities.attempts import AttemptActivities  # noqa: E402
from daedalus.activities.workspace import Workspace  # noqa: E402
from daedalus.agents.codex import CodexAgent  # noqa: E402
from daedalus.agents.settings import AgentSettings  # noqa: E402
from daedalus.devserver import DevServer  # noqa: E402
from daedalus.ports import free_port  # noqa: E402
from daedalus.schemas.steps import AttemptInput  # noqa: E402

FAST_CODEX = """
if os.environ.get("BENCH_MARKS"):  # the moment the agent process runs (interpreter up), keyed by ticket id
    ticket = os.path.basename(os.path.dirname(os.getcwd()))
    open(os.path.join(os.environ["BENCH_MARKS"], ticket), "w").write(repr(time.time()))
emit(type="thread.started", thread_id="th")
for i in range(int(os.environ.get("BENCH_EVENTS", "0"))):
    emit(type="item.completed", item={"id": f"r{i}", "type": "reasoning", "text": "thinking about the kv cache"})
emit(type="item.completed", item={"id": "m", "type": "agent_message", "text": "RESULT: failure"})
emit(type="turn.completed", usage={"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 1})
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def dispatch_runs(client: Client, tmp: Path, kind: str, runs: int) -> list[float]:
    repo = make_engine_repo(tmp / f"engine-{kind}")
    fake = write_fake_cli(tmp / f"codex-{kind}", FAST_CODEX)
    workspace = Workspace(root=tmp / f"ws-{kind}", artifacts=tmp / f"art-{kind}")
    activities = AttemptActivities(
        workspace, fake_cli_settings(tmp, codex_bin=str(fake), sandbox_writable=[str(MARKS)])
    )
    queue = f"bench-{uuid.uuid4()}"
    samples: list[float] = []
    async with Worker(
        client, task_queue=queue, workflows=[AttemptProbe], activities=[activities.run_attempt]
    ):
        for _ in range(runs + 1):
            if kind == "scripted":
                agent: dict[str, Any] = {"name": "scripted", "commands": ["date +%s.%N > started.txt"]}
            else:
                agent = {"name": "codex"}
            spec = ticket_spec(repo, "bench", agent=agent)
            t0 = time.time()
            await client.execute_workflow(
                AttemptProbe.run,
                Probe(request=AttemptInput(spec=spec, attempt=1, brief="b")),
                id=f"bench-{uuid.uuid4()}",
                task_queue=queue,
            )
            if kind == "scripted":
                started = float((workspace.worktree(spec.id, 1) / "started.txt").read_text())
            else:
                started = float((MARKS / spec.id).read_text())
            samples.append((started - t0) * 1000)
    return samples[1:]  # the first run warms imports and the worker


async def openai_runs(tmp: Path, runs: int) -> list[float]:
    from daedalus.agents.openai_agent import OpenAIAgent
    from daedalus.agents.worktree import branch_name, prepare_worktree
    from daedalus.schemas.agents import AgentTask
    from daedalus.schemas.ticket import AgentSpec

    repo = make_engine_repo(tmp / "engine-openai")
    samples = []
    script = Script()
    with serve(script) as url:
        agent = OpenAIAgent(AgentSettings(openai_base_url=f"{url}/v1", openai_api_key=API_KEY))  # type: ignore[arg-type]
        for n in range(1, runs + 2):
            worktree = tmp / "wt-openai" / str(n)
            base = prepare_worktree(
                repo=repo, base_commit="main", worktree=worktree, branch=branch_name("o", n)
            )
            task = AgentTask(
                ticket_id="o",
                attempt=n,
                agent=AgentSpec(name="openai", model="local-coder"),
                brief="b",
                repo=str(repo),
                base_commit=base,
                worktree=str(worktree),
                branch=branch_name("o", n),
            )
            script.turns = [Turn(text="RESULT: failure")]
            arrivals: list[float] = []
            original = script.next

            def next_turn(original: Any = original, arrivals: list[float] = arrivals) -> Turn:
                arrivals.append(time.time())
                return original()  # type: ignore[no-any-return]

            script.next = next_turn  # type: ignore[method-assign]
            art = tmp / "art-openai" / str(n)
            art.mkdir(parents=True)
            t0 = time.time()
            await agent.run(task, artifacts=art, heartbeat=lambda *_: None)
            samples.append((arrivals[0] - t0) * 1000)
    return samples[1:]


async def overhead(tmp: Path, events: int, repeats: int) -> tuple[float, float]:
    """(ms per 1000 events supervised, ms per 1000 events raw)."""
    from daedalus.agents.worktree import branch_name, prepare_worktree
    from daedalus.schemas.agents import AgentTask
    from daedalus.schemas.ticket import AgentSpec

    repo = make_engine_repo(tmp / "engine-ovh")
    fake = write_fake_cli(tmp / "codex-ovh", FAST_CODEX)
    env = {"BENCH_EVENTS": str(events), "PATH": "/usr/bin:/bin"}
    os.environ.pop("BENCH_MARKS", None)
    os.environ["BENCH_EVENTS"] = str(events)
    raw, supervised = [], []
    agent = CodexAgent(fake_cli_settings(tmp, codex_bin=str(fake), idle_timeout_s=60))
    beats = [0]
    for n in range(1, repeats + 1):
        t = time.perf_counter()
        subprocess.run(
            [str(fake)], input=b"prompt", stdout=subprocess.DEVNULL, env={**os.environ, **env}, check=True
        )
        raw.append(time.perf_counter() - t)
        worktree = tmp / "wt-ovh" / str(n)
        base = prepare_worktree(
            repo=repo, base_commit="main", worktree=worktree, branch=branch_name("ovh", n)
        )
        task = AgentTask(
            ticket_id="ovh",
            attempt=n,
            agent=AgentSpec(name="codex"),
            brief="b",
            repo=str(repo),
            base_commit=base,
            worktree=str(worktree),
            branch=branch_name("ovh", n),
        )
        art = tmp / "art-ovh" / str(n)
        art.mkdir(parents=True)
        t = time.perf_counter()
        result = await agent.run(task, artifacts=art, heartbeat=lambda *_: beats.__setitem__(0, beats[0] + 1))
        supervised.append(time.perf_counter() - t)
        assert result.usage.input_tokens == 10, result
    per_k = 1000 / events * 1000
    return statistics.median(supervised) * per_k, statistics.median(raw) * per_k


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--events", type=int, default=5000)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as name,
        DevServer(db_file=None, port=free_port(), ui_port=None, die_with_parent=True) as server,
    ):
        tmp = Path(name)
        global MARKS
        MARKS = tmp / "marks"
        MARKS.mkdir()
        os.environ["BENCH_MARKS"] = str(MARKS)
        client = await Client.connect(server.address, data_converter=DATA_CONVERTER)
        scripted = await dispatch_runs(client, tmp, "scripted", args.runs)
        codex = await dispatch_runs(client, tmp, "codex", args.runs)
        openai_ms = await openai_runs(tmp, args.runs)
        supervised_k, raw_k = await overhead(tmp, args.events, 3)
    rows = {
        "scripted (Temporal → process)": scripted,
        "codex fake (Temporal → process)": codex,
        "openai local (agent → first request)": openai_ms,
    }
    table = Table(title="bench/dispatch.py")
    for column in ("path", "runs", "p50 ms", "p99 ms"):
        table.add_column(column)
    for label, values in rows.items():
        table.add_row(label, str(len(values)), f"{pct(values, 0.5):.1f}", f"{pct(values, 0.99):.1f}")
    table.add_row(
        f"supervision overhead ({args.events} events)",
        "3",
        f"{supervised_k - raw_k:.1f} ms / 1000 events",
        f"raw emit {raw_k:.1f} ms / 1000",
    )
    Console().print(table)
    everything = scripted + codex
    out = {
        "dispatch_to_running_ms_p50": round(pct(everything, 0.5), 2),
        "dispatch_to_running_ms_p99": round(pct(everything, 0.99), 2),
        "overhead_ms_per_1000_events": round(supervised_k - raw_k, 2),
        "scripted_ms_p50": round(pct(scripted, 0.5), 2),
        "scripted_ms_p99": round(pct(scripted, 0.99), 2),
        "codex_fake_ms_p50": round(pct(codex, 0.5), 2),
        "codex_fake_ms_p99": round(pct(codex, 0.99), 2),
        "openai_local_ms_p50": round(pct(openai_ms, 0.5), 2),
        "openai_local_ms_p99": round(pct(openai_ms, 0.99), 2),
        "raw_emit_ms_per_1000_events": round(raw_k, 2),
        "runs": args.runs,
        "events": args.events,
    }
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "dispatch.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
