"""Dispatch latency of the real coding agents: from the dispatch decision to the CLI's first model request.

For each of `codex` (the Codex CLI) and `claude` (Claude Code), as `make agent-clis` installed them:

- temporal: a workflow on a real Temporal dev server calls the attempt activity on a real worker (the ticket's
  attempt step, as the ticket workflow runs it); the clock starts when the workflow is started (the dispatch
  decision) and stops when the local model server receives the CLI's first request. Included: Temporal's
  scheduling, the activity (engine repo sync, the attempt's private checkout), writing the CLI's config, the
  egress gateway's and the bubblewrap sandbox's start, the forwarder inside it, and the CLI's own start-up;
- sandboxed: the agent's `run` alone (gateway, sandbox, forwarder, CLI), no Temporal and no checkout;
- bare: the CLI started directly on the host with the same config, no sandbox: its own start-up.

Each run's script is one final message, so the CLI ends after its first request and runs follow one another.
Prints a table, writes bench/results/dispatch.json with the commit, the machine and the command line.

Run: .venv/bin/python bench/dispatch.py [--runs 200] [--breakdown-runs 40] [--agents codex claude]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from temporalio.client import Client
from temporalio.worker import Worker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.activities.test_attempts import AttemptProbe, Probe  # noqa: E402
from tests.support import make_engine_repo, ticket_spec  # noqa: E402

from daedalus.activities.attempts import AttemptActivities  # noqa: E402
from daedalus.activities.workspace import Workspace  # noqa: E402
from daedalus.agents import worktree as wt  # noqa: E402
from daedalus.agents.claude import ClaudeAgent  # noqa: E402
from daedalus.agents.cli import CliAgent, installed_clis_dir  # noqa: E402
from daedalus.agents.codex import CodexAgent  # noqa: E402
from daedalus.agents.model_server import ModelScript, ModelServer, Reply  # noqa: E402
from daedalus.agents.settings import AgentSettings  # noqa: E402
from daedalus.config import Settings  # noqa: E402
from daedalus.devserver import DevServer  # noqa: E402
from daedalus.engines import paths  # noqa: E402
from daedalus.gates.statistics import quantile_interval  # noqa: E402
from daedalus.payloads import DATA_CONVERTER  # noqa: E402
from daedalus.ports import free_port  # noqa: E402
from daedalus.schemas.agents import AgentTask  # noqa: E402
from daedalus.schemas.steps import AttemptInput  # noqa: E402
from daedalus.schemas.ticket import AgentSpec  # noqa: E402

AGENTS: dict[str, type[CliAgent]] = {"codex": CodexAgent, "claude": ClaudeAgent}
WARMUP = 2


def settings_for(server: ModelServer, key: str) -> AgentSettings:
    return AgentSettings(
        openai_base_url=f"{server.url}/v1",
        openai_api_key=key,  # type: ignore[arg-type]
        anthropic_base_url=server.url,
        anthropic_api_key=key,  # type: ignore[arg-type]
        idle_timeout_s=120,
    )


def arrival(server: ModelServer, key: str, since: float) -> float:
    first = server.first_request_after(key, since)
    if first is None:
        raise RuntimeError(f"no model request arrived for {key}; see the attempt's stderr.log")
    return (first - since) * 1000


async def temporal_runs(client: Client, server: ModelServer, tmp: Path, name: str, runs: int) -> list[float]:
    key = f"bench-temporal-{name}"
    server.add(key, ModelScript.of(Reply("RESULT: failure")))
    repo = make_engine_repo(tmp / f"engine-{name}")
    workspace = Workspace(root=tmp / f"ws-{name}", artifacts=tmp / f"art-{name}")
    activities = AttemptActivities(workspace, settings_for(server, key))
    queue = f"bench-{uuid.uuid4()}"
    samples: list[float] = []
    async with Worker(
        client, task_queue=queue, workflows=[AttemptProbe], activities=[activities.run_attempt]
    ):
        for n in range(runs + WARMUP):
            spec = ticket_spec(repo, "bench", agent={"name": name})
            probe = Probe(request=AttemptInput(spec=spec, attempt=1, brief="bench"), start_to_close_s=120)
            started = time.time()
            await client.execute_workflow(
                AttemptProbe.run, probe, id=f"bench-{uuid.uuid4()}", task_queue=queue
            )
            if n >= WARMUP:
                samples.append(arrival(server, key, started))
            shutil.rmtree(workspace.worktree(spec.id, 1), ignore_errors=True)
    return samples


def task_in(repo: Path, root: Path, name: str, n: int) -> AgentTask:
    worktree, branch = root / f"wt-{n}", wt.branch_name(f"b{n}", 1)
    base = wt.prepare_worktree(repo=repo, base_commit="main", worktree=worktree, branch=branch)
    return AgentTask(
        ticket_id=f"b{n}",
        attempt=1,
        agent=AgentSpec.model_validate({"name": name}),
        brief="bench",
        repo=str(repo),
        base_commit=base,
        worktree=str(worktree),
        branch=branch,
        timeout_s=120,
    )


async def sandboxed_runs(server: ModelServer, tmp: Path, name: str, runs: int) -> list[float]:
    key = f"bench-sandboxed-{name}"
    server.add(key, ModelScript.of(Reply("RESULT: failure")))
    repo = make_engine_repo(tmp / f"engine-sb-{name}")
    agent = AGENTS[name](settings_for(server, key))
    samples = []
    for n in range(runs + WARMUP):
        root = tmp / f"sb-{name}" / str(n)
        task = task_in(repo, root, name, n)
        artifacts = root / "artifacts"
        artifacts.mkdir(parents=True)
        started = time.time()
        await agent.run(task, artifacts=artifacts, heartbeat=lambda *_: None)
        if n >= WARMUP:
            samples.append(arrival(server, key, started))
        shutil.rmtree(root, ignore_errors=True)
    return samples


def bare_runs(server: ModelServer, tmp: Path, name: str, runs: int) -> list[float]:
    """The CLI on the host with the config Daedalus writes, its prompt on stdin, no sandbox and no gateway."""
    key = f"bench-bare-{name}"
    server.add(key, ModelScript.of(Reply("RESULT: failure")))
    repo = make_engine_repo(tmp / f"engine-bare-{name}")
    agent = AGENTS[name](settings_for(server, key))
    samples = []
    for n in range(runs + WARMUP):
        root = tmp / f"bare-{name}" / str(n)
        task = task_in(repo, root, name, n)
        home = root / "home"
        home.mkdir(parents=True)
        agent.configure(task, home, agent.endpoint())
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            **agent.provider_env(agent.endpoint()),
            "CODEX_HOME": str(home / ".codex"),
            # As in its sandbox: whatever else it asks for is refused at once (here by a closed port).
            **{
                name: "http://127.0.0.1:9"
                for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
            },
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        started = time.time()
        subprocess.run(
            [str(agent.binary()), *agent.args(task)],
            input=b"bench",
            cwd=task.worktree,
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        if n >= WARMUP:
            samples.append(arrival(server, key, started))
        shutil.rmtree(root, ignore_errors=True)
    return samples


def summary(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    p50_low, p50_high = quantile_interval(ordered, 0.5)
    p99_low, p99_high = quantile_interval(ordered, 0.99)
    return {
        "n": len(ordered),
        "p50_ms": round(pick(0.5), 1),
        "p50_ci90_ms": [round(v, 1) if v is not None else None for v in (p50_low, p50_high)],
        "p90_ms": round(pick(0.9), 1),
        "p99_ms": round(pick(0.99), 1),
        "p99_ci90_ms": [round(v, 1) if v is not None else None for v in (p99_low, p99_high)],
        "min_ms": round(ordered[0], 1),
        "max_ms": round(ordered[-1], 1),
    }


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return {
        "host": platform.node(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in load],
    }


def commit() -> dict[str, Any]:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    return {"commit": head, "dirty": bool(dirty.strip())}


def versions() -> dict[str, str]:
    installed = installed_clis_dir()
    found = {}
    for name in AGENTS:
        binary = installed / "bin" / name if installed else Path(name)
        with tempfile.TemporaryDirectory() as home:
            out = subprocess.run(
                [str(binary), "--version"], env={"HOME": home}, capture_output=True, text=True
            )
        found[name] = out.stdout.strip()
    return found


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200, help="samples per agent through Temporal")
    parser.add_argument("--breakdown-runs", type=int, default=40, help="samples per agent for the breakdown")
    parser.add_argument("--agents", nargs="+", default=list(AGENTS), choices=list(AGENTS))
    args = parser.parse_args()
    paths.configure(Settings.load().engines)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    where = machine()
    revision = commit()
    rows: dict[str, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory() as name,
        ModelServer() as server,
        DevServer(db_file=None, port=free_port(), ui_port=None, die_with_parent=True) as dev,
    ):
        tmp = Path(name)
        client = await Client.connect(dev.address, data_converter=DATA_CONVERTER)
        for agent in args.agents:
            rows[f"{agent} bare (CLI start-up)"] = summary(bare_runs(server, tmp, agent, args.breakdown_runs))
            rows[f"{agent} sandboxed (agent.run)"] = summary(
                await sandboxed_runs(server, tmp, agent, args.breakdown_runs)
            )
            rows[f"{agent} dispatch (Temporal)"] = summary(
                await temporal_runs(client, server, tmp, agent, args.runs)
            )
    table = Table(title="bench/dispatch.py: until the CLI's first model request (ms)")
    for column in ("path", "n", "p50 [90% CI]", "p90", "p99 [90% CI]", "min", "max"):
        table.add_column(column)
    for label, row in rows.items():
        table.add_row(
            label,
            str(row["n"]),
            f"{row['p50_ms']} {row['p50_ci90_ms']}",
            str(row["p90_ms"]),
            f"{row['p99_ms']} {row['p99_ci90_ms']}",
            str(row["min_ms"]),
            str(row["max_ms"]),
        )
    Console().print(table)
    out = {
        "what": "dispatch decision -> the real CLI's first model request (ms); sandbox start included",
        "started_at": started_at,
        **revision,
        "machine": where,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "versions": versions(),
        "results": rows,
    }
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "dispatch.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
