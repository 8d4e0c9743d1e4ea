"""A ticket on real hosts, end to end on the dev server: a step queued on a host no worker polls is seen at once
(store, API, report) and escalates as "host unavailable" after the host's schedule-to-start limit; an engine repo
that cannot be reached spends no attempt and says what to fix; a gate on a host with GPUs runs under a lease from
the host's keeper, and its verdict records the lease. No attempt is spent on the host's problems: retry resumes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import yaml
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus import services as daedalus
from daedalus.agents.settings import AgentSettings
from daedalus.api import create_app
from daedalus.api.settings import ApiSettings
from daedalus.hosts import holder
from daedalus.hosts.registry import GpuSpec, HostSpec, Registry
from daedalus.hosts.status import describe_queue, waiting_on_hosts
from daedalus.report import build_report, render_markdown
from daedalus.schemas.gates import Verdict
from daedalus.schemas.ticket import AttemptOutcome, CancelRequest, Decision, TicketStatus
from daedalus.slack.settings import SlackSettings
from daedalus.store import queries
from daedalus.store import tokens as api_tokens
from daedalus.store.database import session_scope
from daedalus.store.tables import TicketRow
from daedalus.worker import WorkerConfig, build_workers
from daedalus.workflows.ticket import TicketWorkflow
from tests.support import TEST_AUDIT_KEY, TEST_STEPS, gate_command, make_engine_repo, ticket_spec
from tests.ticket_helpers import host_of, pending
from tests.workflows.test_ticket_replay import replay_and_keep

DAEDALUS = str(Path(sys.executable).parent / "daedalus")
WAYNE_TOKEN = "dtk_0000a11e_" + "w" * 43
"""A well-formed API token of wayne's; the test stores its hash."""
WAYNE = {"Authorization": f"Bearer {WAYNE_TOKEN}"}


@asynccontextmanager
async def workers(
    client: Client, engine: Engine | None, tmp_path: Path, control_queue: str, hosts: list[str]
) -> AsyncIterator[None]:
    """The control worker (with a store) and the given hosts' workers, as `daedalus worker` runs them."""
    config = WorkerConfig(
        steps=TEST_STEPS,
        audit_key=TEST_AUDIT_KEY,
        slack=SlackSettings(),
        agent=AgentSettings(),
        control_queue=control_queue,
        hosts=hosts,
        workspace_root=tmp_path / "ws",
        artifacts=tmp_path / "artifacts",
        fail_workflows_on_bugs=True,
    )
    running = build_workers(client, config, engine)
    tasks = [asyncio.create_task(w.run()) for w in running]
    try:
        yield
    finally:
        await asyncio.gather(*(w.shutdown() for w in running))
        await asyncio.gather(*(tasks), return_exceptions=True)


def ticket_row(engine: Engine, ticket_id: str) -> TicketRow | None:
    with session_scope(engine) as session:
        return queries.get_ticket(session=session, ticket_id=ticket_id)


async def store_shows(engine: Engine, ticket_id: str, status: TicketStatus, timeout: float = 60) -> TicketRow:
    for _ in range(int(timeout / 0.2)):
        row = ticket_row(engine, ticket_id)
        if row is not None and row.status == status.value:
            return row
        await asyncio.sleep(0.2)
    raise AssertionError(f"ticket {ticket_id} never reached {status.value} in the store")


async def polled(client: Client, queue: str, timeout: float = 60) -> None:
    """Until a worker has polled `queue` (a worker's first poll comes a moment after it starts)."""
    for _ in range(int(timeout / 0.2)):
        if (await describe_queue(client, queue)).pollers:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"no worker polled {queue} within {timeout:g}s")


async def test_a_host_nobody_serves_is_seen_and_escalates_as_unavailable_without_spending_an_attempt(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    # Seen: a first ticket waits under a limit long enough for every view to be asked (the CLI takes seconds).
    registry = Registry(hosts=[HostSpec(name=host, schedule_to_start_s=600)])
    hosts_file = tmp_path / "hosts.yaml"
    hosts_file.write_text(yaml.safe_dump(registry.model_dump(mode="json")))
    repo = make_engine_repo(tmp_path / "repo")
    seen = ticket_spec(repo, host)
    api_tokens.add(sqlite_engine, "wayne", WAYNE_TOKEN, created_by="tests")
    app = create_app(
        client=temporal_client,
        engine=sqlite_engine,
        control_queue=task_queue,
        settings=ApiSettings(),
        slack=SlackSettings(),
        hosts_file=hosts_file,
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://daedalus") as api,
        workers(temporal_client, sqlite_engine, tmp_path, task_queue, hosts=[]),
    ):
        waiting = await daedalus.file_ticket(temporal_client, seen, queue=task_queue, hosts=registry)
        row = await store_shows(sqlite_engine, seen.id, TicketStatus.DISPATCHED)
        # Seen at once: before the limit, every view says where the step waits and what to run.
        line = (await waiting_on_hosts(temporal_client, registry, [row]))[seen.id]
        assert f"queued for host-{host} since {row.updated_at:%H:%M} UTC; no worker polls it" in line
        assert f"run `daedalus worker --host {host}` there" in line
        listed = (await api.get("/tickets", headers=WAYNE)).json()
        assert [t["waiting_on_host"] for t in listed if t["ticket_id"] == seen.id] == [line]
        shown = (await api.get(f"/tickets/{seen.id}", headers=WAYNE)).json()
        assert shown["projection"]["waiting_on_host"] == line
        report = (await api.get("/report?format=md", headers=WAYNE)).text
        assert line in report
        env = {
            **os.environ,
            "DAEDALUS_TEMPORAL_ADDRESS": temporal_client.service_client.config.target_host,
            "DAEDALUS_DATABASE_URL": str(sqlite_engine.url),
            "DAEDALUS_HOSTS_FILE": str(hosts_file),
            "DAEDALUS_HOME": str(tmp_path / "home"),
            "COLUMNS": "400",
        }
        for command in (["ticket", "list"], ["ticket", "show", seen.id]):
            done = await asyncio.to_thread(
                subprocess.run, [DAEDALUS, *command], env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            assert line in " ".join(done.stdout.split()), done.stdout
        [view] = (await api.get("/hosts", headers=WAYNE)).json()
        assert view["host"]["name"] == host and view["queue"]["pollers"] == []

        await daedalus.cancel(temporal_client, seen.id, CancelRequest(requested_by="wayne", reason="seen"))
        assert (await asyncio.wait_for(waiting.result(), 60)).status is TicketStatus.CANCELLED

        # Unavailable: after the host's schedule-to-start limit, not the agent's failure.
        registry = Registry(hosts=[HostSpec(name=host, schedule_to_start_s=5)])
        spec = ticket_spec(repo, host)
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue, hosts=registry)
        state, request = await pending(handle, timeout=60)
        assert request.kind.value == "escalation"
        assert f"host {host} is unavailable: no worker took its attempt 1 from task queue host-{host}" in (
            request.question
        )
        assert f"Run `daedalus worker --host {host}` on {host}" in request.question
        assert state.attempts == [] and state.status is TicketStatus.AWAITING_DECISION
        assert (await api.get(f"/tickets/{spec.id}", headers=WAYNE)).json()["projection"][
            "waiting_on_host"
        ] is None  # waiting for a person now, not for a worker

        # The worker comes (and polls: the retried step has the same limit); retry runs attempt 1, not 2.
        async with workers(temporal_client, None, tmp_path, task_queue, hosts=[host]):
            await polled(temporal_client, f"host-{host}")
            await handle.execute_update(
                TicketWorkflow.decide, Decision(request_id=request.id, option="retry", decided_by="wayne")
            )
            final = await asyncio.wait_for(handle.result(), 120)
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    assert [a.number for a in final.attempts] == [1]
    await replay_and_keep(handle, "host-unavailable")


async def test_an_unreachable_engine_repo_spends_no_attempt_and_says_what_to_fix(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    registry = Registry(hosts=[HostSpec(name=host)])
    served = tmp_path / "served" / "1cat-vllm.git"
    url = served.as_uri()  # file:// — gone until the "fix" below serves it
    engine = {"name": "1cat-vllm", "kind": "vllm", "repo": url, "base_commit": "main"}
    spec = ticket_spec(tmp_path, host, engine=engine)
    async with workers(temporal_client, sqlite_engine, tmp_path, task_queue, hosts=[host]):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue, hosts=registry)
        state, request = await pending(handle, timeout=60)
        assert f"the environment of host {host} is broken, so its attempt 1 could not run" in request.question
        assert f"engine repo {url} cannot be reached from host {host}" in request.question
        assert "Fix: check the URL" in request.question
        assert state.attempts == []
        assert not (tmp_path / "artifacts" / "tickets" / spec.id / "attempt-1" / "result.json").exists()

        served.parent.mkdir(parents=True)
        source = make_engine_repo(tmp_path / "upstream")
        subprocess.run(["git", "clone", "-q", "--bare", str(source), str(served)], check=True)
        await handle.execute_update(
            TicketWorkflow.decide, Decision(request_id=request.id, option="retry", decided_by="wayne")
        )
        final = await asyncio.wait_for(handle.result(), 120)
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    assert [(a.number, a.outcome) for a in final.attempts] == [(1, AttemptOutcome.GATES_PASSED)]
    await replay_and_keep(handle, "host-environment")


async def test_gates_on_a_host_with_gpus_run_under_a_lease_that_the_verdict_records(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    gpus = GpuSpec(count=2, model="simulated", memory_gib=8, simulated=True)
    registry = Registry(hosts=[HostSpec(name=host, gpus=gpus)])
    # The gate sees only the leased GPUs, and checks it did: a command without them exits 3 (INVALID).
    gate = f'test "$CUDA_VISIBLE_DEVICES" = "0,1" || exit 3; {gate_command()}'
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"),
        host,
        gates=[{"name": "decode", "metric": "decode_tps", "threshold": 55, "command": gate}],
    )
    async with workers(temporal_client, sqlite_engine, tmp_path, task_queue, hosts=[host]):
        await holder.ensure_keeper(temporal_client, registry, host, control_queue=task_queue)
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue, hosts=registry)
        final = await asyncio.wait_for(handle.result(), 120)
        keeper = await holder.keeper_state(temporal_client, host)
        await replay_and_keep(handle, "gate-leased")
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    [result] = final.attempts[0].gate_results
    assert result.verdict is Verdict.PASS and result.lease is not None
    assert result.lease.host == host and result.lease.gpus == [0, 1]
    assert result.lease.lease_id.startswith(f"ticket-{spec.id}/") and result.lease.lease_id.endswith(
        "/round-1"
    )
    assert keeper.held == [] and keeper.counters.released == 1 and keeper.counters.expired == 0
    with session_scope(sqlite_engine) as session:
        [row] = queries.verdicts(session=session, ticket_id=spec.id)
        built = build_report(session=session, since=row.recorded_at - timedelta(hours=1))
    assert row.lease == result.lease.model_dump(mode="json")
    assert spec.id in render_markdown(built)
