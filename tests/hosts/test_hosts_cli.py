"""`daedalus hosts` and filing against the registry, as a person runs them: real worker processes, the
session's dev server, a per-test hosts.yaml."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from temporalio.client import Client

from daedalus.devserver import DevServer
from daedalus.hosts import holder
from daedalus.hosts.leases import LeaseRequest
from daedalus.hosts.registry import load_registry
from daedalus.hosts.status import Poller, queued_explanation, unserved

DAEDALUS = str(Path(sys.executable).parent / "daedalus")


@pytest.fixture
def pool(temporal_server: DevServer, tmp_path: Path, task_queue: str) -> dict[str, str]:
    tag = uuid.uuid4().hex[:6]
    hosts = {
        "hosts": [
            {
                "name": f"served-{tag}",
                "gpus": {"count": 2, "model": "simulated", "memory_gib": 8, "simulated": True},
                "tenants": [
                    {"name": "render", "gpus": [1], "priority": 60, "pause": "true", "resume": "true"}
                ],
            },
            {"name": f"idle-{tag}", "gpus": {"count": 1, "model": "V100", "memory_gib": 32}},
        ],
        "constraints": [
            {"id": "cap", "setting": "max_model_len", "op": "<=", "value": 16384, "until_ticket": "5"}
        ],
    }
    hosts_file = tmp_path / "hosts.yaml"
    hosts_file.write_text(yaml.safe_dump(hosts))
    return {
        **os.environ,
        "DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address,
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "DAEDALUS_CONTROL_QUEUE": task_queue,
        "DAEDALUS_HOSTS_FILE": str(hosts_file),
        "COLUMNS": "200",
    }


def daedalus(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DAEDALUS, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def served(pool: dict[str, str]) -> Iterator[str]:
    host = load_registry(Path(pool["DAEDALUS_HOSTS_FILE"])).names[0]
    process = subprocess.Popen(
        [DAEDALUS, "worker", "--control", "--host", host], env=pool, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    yield host
    os.killpg(process.pid, signal.SIGINT)
    process.wait(30)


def test_filing_refuses_an_unknown_host_with_the_known_ones(pool: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "typo.yaml"
    gate = {"name": "decode", "metric": "decode_tps", "threshold": 1, "command": "true"}
    spec.write_text(yaml.safe_dump({"id": "typo-1", "title": "t", "host": "locla", "gates": [gate]}))
    refused = daedalus(pool, "ticket", "create", "-f", str(spec))
    assert refused.returncode == 2
    names = load_registry(Path(pool["DAEDALUS_HOSTS_FILE"])).names
    assert (
        f"ticket typo-1 names unknown host 'locla'; hosts.yaml declares: {', '.join(names)}" in refused.stderr
    )
    assert daedalus(pool, "ticket", "show", "typo-1").returncode == 2  # nothing was started
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "hosts:\n  - name: a\n    gpus: {count: 1}\n    tenants: [{name: t, gpus: [3], pause: x, resume: y}]\n"
    )
    bad = daedalus({**pool, "DAEDALUS_HOSTS_FILE": str(broken)}, "ticket", "create", "-f", str(spec))
    assert bad.returncode == 2 and "tenant t names GPUs [3], but host a has 1 GPU(s)" in bad.stderr


async def test_hosts_shows_workers_leases_tenants_and_constraints(
    pool: dict[str, str], served: str, temporal_client: Client
) -> None:
    idle = load_registry(Path(pool["DAEDALUS_HOSTS_FILE"])).names[1]
    request = LeaseRequest(lease_id="gate-1", holder="ticket 4 gate decode", gpus=[0], ttl_s=30)
    deadline = time.monotonic() + 30
    while True:  # the worker process starts the keepers
        try:
            await holder.acquire(temporal_client, served, request)
            break
        except holder.LeaseError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    shown = daedalus(pool, "hosts")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    served_part, idle_part = out.split(f"\n{idle} ", 1)
    assert "1 polling" in served_part and "gate-1" in served_part and "ticket 4 gate decode" in served_part
    assert "tenant render: running on GPUs [1]" in served_part
    assert "cap: max_model_len <= 16384 until ticket 5 passes" in out
    assert f"none polling (last seen -); run `daedalus worker --host {idle}` there" in idle_part
    as_json = json.loads(daedalus(pool, "hosts", "--json", "--host", served).stdout)
    assert [lease["lease_id"] for lease in as_json[0]["keeper"]["held"]] == ["gate-1"]
    assert as_json[0]["queue"]["pollers"]
    registry = load_registry(Path(pool["DAEDALUS_HOSTS_FILE"]))
    since = datetime.now(UTC) - timedelta(minutes=1)
    assert await unserved(temporal_client, registry.host(served), since) is None
    line = await unserved(temporal_client, registry.host(idle), since)
    assert line == (
        f"queued for host-{idle} since {since:%H:%M} UTC; no worker polls it; run `daedalus worker --host {idle}` there"
    )
    unknown = daedalus(pool, "hosts", "--host", "nope")
    assert unknown.returncode == 2 and "unknown host 'nope'" in unknown.stderr
    await holder.release(temporal_client, served, "gate-1")


def test_the_queued_line_names_the_queue_the_time_and_the_command() -> None:
    since = datetime(2026, 7, 12, 22, 3, tzinfo=UTC)
    now = since + timedelta(minutes=5)
    assert queued_explanation("mavis", "host-mavis", since, [], now) == (
        "queued for host-mavis since 22:03 UTC; no worker polls it; run `daedalus worker --host mavis` there"
    )
    stale = [Poller(identity="1@mavis", last_seen=since - timedelta(hours=1))]
    assert "its last worker was seen at 21:03 UTC" in (
        queued_explanation("mavis", "host-mavis", since, stale, now) or ""
    )
    fresh = [Poller(identity="1@mavis", last_seen=now - timedelta(seconds=5))]
    assert queued_explanation("mavis", "host-mavis", since, fresh, now) is None
