"""`daedalus host check` and `daedalus worker`'s check at start, as a person runs them: real worker processes, the
session's dev server, real bubblewrap; the GPU readers against what nvidia-smi and NVML said on the lent H200."""

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

from daedalus.config import Settings
from daedalus.devserver import DevServer
from daedalus.hosts.check import MAX_CLOCK_SKEW_S, CheckContext, check_sandbox, judge_clock
from daedalus.schemas.host_check import CheckLine, CheckStatus

DAEDALUS = str(Path(sys.executable).parent / "daedalus")


@pytest.fixture
def hosts_env(temporal_server: DevServer, tmp_path: Path, task_queue: str) -> dict[str, str]:
    """A registry of a CPU host (GPUs simulated) and a host declared with a real GPU, which this machine lacks."""
    tag = uuid.uuid4().hex[:6]
    hosts = {
        "hosts": [
            {
                "name": f"cpu-{tag}",
                "gpus": {"count": 2, "model": "simulated", "memory_gib": 8, "simulated": True},
            },
            {"name": f"gpu-{tag}", "gpus": {"count": 1, "model": "NVIDIA H200", "memory_gib": 140}},
        ]
    }
    hosts_file = tmp_path / "hosts.yaml"
    hosts_file.write_text(yaml.safe_dump(hosts))
    return {
        **os.environ,
        "DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address,
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "DAEDALUS_CONTROL_QUEUE": task_queue,
        "DAEDALUS_HOSTS_FILE": str(hosts_file),
        "COLUMNS": "240",
    }


def names(env: dict[str, str]) -> tuple[str, str]:
    hosts = yaml.safe_load(Path(env["DAEDALUS_HOSTS_FILE"]).read_text())["hosts"]
    return hosts[0]["name"], hosts[1]["name"]


def daedalus(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DAEDALUS, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def control(hosts_env: dict[str, str]) -> Iterator[None]:
    """The control worker: it starts each declared host's lease keeper, which keeps the host's last check."""
    process = subprocess.Popen([DAEDALUS, "worker", "--control"], env=hosts_env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while '"keeper": null' in daedalus(hosts_env, "hosts", "--json").stdout or not daedalus(
        hosts_env, "hosts", "--json"
    ).stdout.strip().startswith("["):
        assert time.monotonic() < deadline, "the control worker did not start the lease keepers"
        time.sleep(0.5)
    yield
    os.killpg(process.pid, signal.SIGINT)
    process.wait(30)


def hosts_shown(env: dict[str, str], host: str) -> str:
    shown = daedalus(env, "hosts", "--host", host)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


@pytest.mark.timeout(300)
def test_a_worker_does_not_poll_a_host_that_fails_its_check_and_hosts_shows_why(
    hosts_env: dict[str, str], control: None
) -> None:
    cpu, gpu = names(hosts_env)
    refused = daedalus(hosts_env, "worker", "--host", gpu)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"not polling host-{gpu}" in refused.stdout and "no host passed its check" in refused.stderr
    assert "1 GPU(s) declared, but they cannot be read" in refused.stdout
    shown = hosts_shown(hosts_env, gpu)
    assert "check: FAILED" in shown and "none polling" in shown
    assert (
        "fail gpus: 1 GPU(s) declared, but they cannot be read" in shown
        and "— fix: install the NVIDIA" in shown
    )

    # The CPU host passes and is served; its kept check carries Temporal's clock.
    worker = subprocess.Popen([DAEDALUS, "worker", "--host", cpu], env=hosts_env, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "1 polling" not in (shown := hosts_shown(hosts_env, cpu)):
            assert worker.poll() is None, worker.communicate()[0]
            assert time.monotonic() < deadline, shown
            time.sleep(0.5)
        assert "check: ok" in shown, shown
        kept = json.loads(daedalus(hosts_env, "hosts", "--json", "--host", cpu).stdout)[0]["keeper"][
            "last_check"
        ]
        lines = {line["name"]: line for line in kept["check"]["lines"]}
        assert lines["clock"]["status"] == "ok" and "clock minus Temporal's" in lines["clock"]["detail"]
        assert {lines[n]["status"] for n in ("packages", "sandbox", "steps", "temporal")} == {"ok"}
        assert lines["gpus"]["status"] == "skip"
    finally:
        os.killpg(worker.pid, signal.SIGINT)
        worker.wait(30)


def test_host_check_exits_1_on_a_failure_and_prints_each_fix(
    hosts_env: dict[str, str], control: None
) -> None:
    _, gpu = names(hosts_env)
    done = daedalus(hosts_env, "host", "check", "--host", gpu, "--json")
    assert done.returncode == 1, done.stderr
    check = json.loads(done.stdout)
    failed = [line for line in check["lines"] if line["status"] == "fail"]
    assert failed and all(line["fix"] for line in failed)
    assert {line["name"] for line in check["lines"]} >= {"packages", "sandbox", "steps", "gpus", "engine", "temporal",
                                                         "disk-cache", "disk-home", "clock"}  # fmt: skip


def test_a_host_without_bubblewrap_fails_the_sandbox_check_naming_the_bundle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH, and none beside this Python
    assert not (Path(sys.executable).parent / "bwrap").exists()
    line = check_sandbox(CheckContext(Settings.load(env_file=None), "x", None))
    assert line.status is CheckStatus.FAIL
    assert "bubblewrap (`bwrap`) is not installed" in line.detail and "offline bundle" in line.fix


def test_the_sandbox_check_sees_every_namespace_unshared() -> None:
    line = check_sandbox(CheckContext(Settings.load(env_file=None), "x", None))
    assert line.status is CheckStatus.OK, line
    assert "user, mnt, pid, net, ipc, uts" in line.detail


def test_clock_skew_is_judged_by_its_whole_interval() -> None:
    server = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

    def judged(sent_offset: float, round_trip: float) -> CheckLine:
        sent = server + timedelta(seconds=sent_offset)
        return judge_clock(sent, sent + timedelta(seconds=round_trip), server)

    assert judged(-0.01, 0.02).status is CheckStatus.OK
    late = judged(MAX_CLOCK_SKEW_S + 55, 0.02)
    assert late.status is CheckStatus.FAIL and "timedatectl" in late.fix and "+60.000" in late.detail
    assert judged(-MAX_CLOCK_SKEW_S - 30, 0.02).status is CheckStatus.FAIL
    assert judged(-1.0, 2 * MAX_CLOCK_SKEW_S).status is CheckStatus.WARN  # too slow a round trip to tell


def test_a_failed_line_must_name_its_fix() -> None:
    with pytest.raises(ValueError, match="failed without saying how to fix it"):
        CheckLine(name="x", status=CheckStatus.FAIL, detail="broken")
