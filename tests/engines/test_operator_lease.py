"""`daedalus engine bench --host`: an operator's engine run holds a lease on the host's GPUs from the host's real
lease keeper (on the session's dev server), its llama-server sees only those GPUs, and it stops when the lease is
lost; a preset the host's standing constraints forbid is refused before anything starts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml
from temporalio.client import Client
from tests.engines.children import serving_llama_servers
from tests.hosts.keeper_support import running_keeper

from daedalus.engines.llama_build import LlamaBuild
from daedalus.hosts import holder
from daedalus.hosts.registry import Constraint, Registry

DAEDALUS = str(Path(sys.executable).parent / "daedalus")


def cli_env(client: Client, registry: Registry, tmp_path: Path) -> dict[str, str]:
    hosts_file = tmp_path / "hosts.yaml"
    hosts_file.write_text(yaml.safe_dump(registry.model_dump(mode="json")))
    return {
        **os.environ,
        "DAEDALUS_TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "DAEDALUS_HOSTS_FILE": str(hosts_file),
        "DAEDALUS_HOME": str(tmp_path / "home"),
    }


def bench(model: Path, *extra: str) -> list[str]:
    return [DAEDALUS, "engine", "bench", "--preset", "local-f16", "--model", str(model), *extra]


async def llama_servers(command: subprocess.Popen[str], timeout: float = 120) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        servers = serving_llama_servers(command.pid)
        if servers:
            return servers
        assert command.poll() is None, command.communicate()
        assert time.monotonic() < deadline, "no llama-server started"
        await asyncio.sleep(0.2)


async def test_an_operators_bench_holds_its_lease_and_stops_when_it_is_lost(
    temporal_client: Client, tmp_path: Path, llama_build: LlamaBuild, tiny_model: Path
) -> None:
    async with running_keeper(temporal_client, tmp_path, gpus=2, host_worker=False) as keeper:
        command = subprocess.Popen(
            bench(
                tiny_model,
                "--rounds",
                "100",
                "--users",
                "1",
                "--max-tokens",
                "4000",
                "--host",
                keeper.host,
                "--gpu",
                "1",
            ),
            env=cli_env(temporal_client, keeper.registry, tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            servers = await llama_servers(command)
            environment = servers[0].environ()
            [held] = (await holder.keeper_state(temporal_client, keeper.host)).held
            assert held.gpus == [1] and held.purpose == "benchmark" and held.priority == 50
            assert held.holder.endswith("daedalus engine bench local-f16"), held.holder
            assert environment["CUDA_VISIBLE_DEVICES"] == "1"
            assert environment["DAEDALUS_LEASE_ID"] == held.lease_id
            # Someone takes the GPUs back (as a revocation does): the run learns it at its next heartbeat.
            await holder.release(temporal_client, keeper.host, held.lease_id, reason="taken back by the test")
            _, stderr = await asyncio.to_thread(command.communicate, timeout=90)
        finally:
            if command.poll() is None:
                command.kill()
        assert command.returncode == 2, stderr
        assert f"lease {held.lease_id} on host {keeper.host} lost" in " ".join(stderr.split())
        _, alive = psutil.wait_procs(servers, timeout=10)
        assert not alive, f"llama-server outlived its lease: {alive}"
        assert (await holder.keeper_state(temporal_client, keeper.host)).held == []


async def test_a_preset_the_hosts_constraints_forbid_is_refused_before_anything_starts(
    temporal_client: Client, tmp_path: Path, tiny_model: Path
) -> None:
    only_q8 = Constraint(id="kv-q8", setting="kv_cache_dtype", op="==", value="q8_0", reason="pool memory")
    async with running_keeper(
        temporal_client, tmp_path, gpus=2, constraints=[only_q8], host_worker=False
    ) as keeper:
        env = cli_env(temporal_client, keeper.registry, tmp_path)
        refused = await asyncio.to_thread(
            subprocess.run,
            bench(tiny_model, "--host", keeper.host),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2, refused.stderr
        assert "preset local-f16 is refused" in " ".join(refused.stderr.split()), refused.stderr
        assert "decode tok/s" not in refused.stdout, "nothing was measured"
        state = await holder.keeper_state(temporal_client, keeper.host)
        assert state.held == [] and state.waiting == []
        for wrong, says in (
            (["--host", "nowhere"], "nowhere"),
            (["--gpu", "1"], "give --host too"),
            (["--host", keeper.host, "--gpu", "1", "--gpu", "1"], "must be distinct indices"),
        ):
            done = await asyncio.to_thread(
                subprocess.run, bench(tiny_model, *wrong), env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 2 and says in " ".join(done.stderr.split()), (wrong, done.stderr)
