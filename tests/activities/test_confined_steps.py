"""Attacks on builds and gates: the ticket's command is approved, but what it runs is the agent's code.

Each attack is what an agent's patch can make a build or gate do (a `build.sh`, a test, a preset); each ran on
the worker before builds and gates were confined. Real bubblewrap, real cgroups, a real dev server; the
assertions look at the host.
"""

from __future__ import annotations

import sqlite3
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from daedalus.activities.builds import BuildActivities
from daedalus.activities.confined import ConfinedSteps
from daedalus.activities.gates import GateActivities
from daedalus.activities.workspace import Workspace
from daedalus.agents import worktree as wt
from daedalus.confinement import StepCgroup, StepSettings, gpu_device_nodes
from daedalus.devserver import DevServer
from daedalus.sandbox import Sandbox
from daedalus.schemas.gates import GateSpec, LeaseRecord, Verdict
from daedalus.schemas.steps import BuildInput, BuildResult, GateInput, ResourceLimits
from tests.support import make_engine_repo, sleeping, unique_sleep

SECRETS = {
    "DAEDALUS_SLACK_BOT_TOKEN": "xoxb-slack-secret-5711",
    "DAEDALUS_SLACK_SIGNING_SECRET": "signing-secret-5712",
    "OPENAI_API_KEY": "sk-openai-secret-5713",
    "DAEDALUS_DATABASE_URL": "postgresql+psycopg://daedalus:pw-5714@127.0.0.1/daedalus",
}
LIMITS = ResourceLimits(processes=64, memory_mib=256, tmp_mib=16)
MEASUREMENT = '{"samples": [56.0, 56.1, 55.9, 56.2, 56.0], "unit": "tok/s"}'


class Host:
    """A host's workspace with one attempt checked out: the build and gate activities as the worker has them."""

    def __init__(self, tmp_path: Path, limits: ResourceLimits = LIMITS) -> None:
        self.tmp = tmp_path
        self.workspace = Workspace(root=tmp_path / "ws", artifacts=tmp_path / "artifacts")
        self.repo = make_engine_repo(tmp_path / "engine")
        self.workspace._record_checkout("t1", 1, self.repo)
        wt.prepare_worktree(
            repo=self.repo, base_commit="main", worktree=self.worktree, branch=wt.branch_name("t1", 1)
        )
        self.steps = ConfinedSteps(self.workspace, StepSettings(), limits)

    @property
    def worktree(self) -> Path:
        return self.workspace.worktree("t1", 1)

    def agent_writes(self, name: str, text: str) -> None:
        """What an agent's patch leaves in the attempt (and the host then builds and measures)."""
        (self.worktree / name).write_text(text)

    async def build(self, command: str) -> BuildResult:
        return await ActivityEnvironment().run(
            BuildActivities(self.steps).run_build,
            BuildInput(ticket_id="t1", attempt=1, command=command, timeout_s=60),
        )

    async def gate(self, command: str, lease: LeaseRecord | None = None) -> tuple[Verdict, str]:
        gate = GateSpec.model_validate(
            {"name": "decode", "metric": "decode_tps", "command": command, "threshold": 55, "timeout_s": 60}
        )
        result = await ActivityEnvironment().run(
            GateActivities(self.steps).run_gate,
            GateInput(ticket_id="t1", attempt=1, gate=gate, host="local", lease=lease),
        )
        return result.verdict, result.reason


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Host:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return Host(tmp_path)


async def test_a_build_script_sees_no_secret_no_store_and_cannot_write_outside(host: Host) -> None:
    store = host.tmp / "home" / "daedalus.db"
    store.parent.mkdir()
    with sqlite3.connect(store) as db:
        db.execute("create table api_tokens (person text)")
    outside = host.tmp / f"planted-{uuid.uuid4().hex}"
    host.agent_writes(
        "build.sh",
        "env > env.txt; cat /proc/1/environ >> env.txt 2>/dev/null;"
        f" sqlite3 {store} \"insert into api_tokens values ('wayne')\" 2>> env.txt;"
        f" python3 -c \"import sqlite3; sqlite3.connect('{store}').execute('insert into api_tokens values (1)')\""
        " 2>> env.txt;"
        f" touch {outside} 2>> env.txt; touch {host.workspace.artifacts}/planted 2>> env.txt; echo built\n",
    )
    result = await host.build("sh build.sh")
    assert result.ok, result.log_tail
    seen = (host.worktree / "env.txt").read_text()
    assert all(value not in seen for value in SECRETS.values()), seen
    with sqlite3.connect(store) as db:
        assert db.execute("select count(*) from api_tokens").fetchone() == (0,)
    assert not outside.exists() and not (host.workspace.artifacts / "planted").exists()


async def test_a_gate_cannot_reach_temporal_or_any_port_of_the_host(
    host: Host, temporal_server: DevServer
) -> None:
    port = temporal_server.address.rsplit(":", 1)[1]
    host.agent_writes(
        "probe.py",
        "import socket, sys\n"
        f"for port in ({port}, 5432, 8233):\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', port), timeout=2); print('reached', port, file=sys.stderr)\n"
        "    except OSError as error:\n"
        "        print('refused', port, error, file=sys.stderr)\n"
        f"print({MEASUREMENT!r})\n",
    )
    verdict, reason = await host.gate("python3 probe.py")
    log = (host.workspace.attempt_artifacts("t1", 1) / "gate-decode-round-1.log").read_text()
    lines = log.splitlines()
    assert not [line for line in lines if line.startswith("reached")], log
    assert len([line for line in lines if line.startswith("refused")]) == 3, log
    assert verdict is Verdict.PASS, reason  # the worker, outside, read the measurement and decided


async def test_a_gate_names_a_preset_of_the_checkouts_examples_as_it_would_outside(host: Host) -> None:
    """Found by bench/chaos.py: confined, `daedalus engine measure --preset local-f16` found no preset (only the
    shipped ones were in its sandbox), so a llama.cpp gate escalated on every retry."""
    host.agent_writes(
        "which.py",
        "import sys\nfrom daedalus.engines.presets import load_preset\n"
        "print(load_preset('local-f16').name, file=sys.stderr)\n"
        f"print({MEASUREMENT!r})\n",
    )
    verdict, reason = await host.gate("python3 which.py")
    log = (host.workspace.attempt_artifacts("t1", 1) / "gate-decode-round-1.log").read_text()
    assert verdict is Verdict.PASS and "local-f16" in log, (reason, log)


async def test_children_that_drop_the_step_token_die_with_the_build(host: Host) -> None:
    first, second, third = unique_sleep(), unique_sleep(), unique_sleep()
    result = await host.build(
        f"env -u DAEDALUS_STEP_TOKEN setsid nohup sleep {first} >/dev/null 2>&1 &"
        f" env -i setsid sleep {second} >/dev/null 2>&1 & (setsid sleep {third} &) ; echo built"
    )
    assert result.ok, result.log_tail
    assert sleeping(first) == [] and sleeping(second) == [] and sleeping(third) == []


async def test_a_gate_that_forks_past_its_process_limit_is_invalid_and_says_so(host: Host) -> None:
    verdict, reason = await host.gate(f"for i in $(seq 200); do sleep 5 & done; wait; echo '{MEASUREMENT}'")
    assert verdict is Verdict.INVALID
    assert "process limit (64 processes)" in reason, reason


async def test_a_build_past_its_memory_limit_fails_and_says_so(host: Host) -> None:
    result = await host.build('python3 -c "b = bytearray(600 * 2**20); print(len(b))"')
    assert not result.ok
    assert "memory limit (256 MiB)" in result.log_tail, result.log_tail


async def test_tmp_is_small_and_the_steps_own(host: Host) -> None:
    result = await host.build("dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1; df -m /tmp | tail -1")
    assert "No space left" in result.log_tail, result.log_tail
    assert not Path("/tmp/fill").exists() or Path("/tmp/fill").stat().st_size < 64 * 2**20


async def test_the_worktree_cannot_shadow_the_python_a_gate_runs(host: Host) -> None:
    """`python -m daedalus...` in a gate must run Daedalus's code: a module in the worktree does not shadow it."""
    host.agent_writes("json.py", "def dumps(value): return '{\"samples\": [99, 99, 99, 99, 99]}'\n")
    (host.tmp / "measure.py").write_text(f"import json\nprint(json.dumps({MEASUREMENT}))\n")
    host.steps = ConfinedSteps(host.workspace, StepSettings(read_only=[host.tmp]), LIMITS)
    verdict, reason = await host.gate(f"python3 -c 'import runpy; runpy.run_path(\"{host.tmp}/measure.py\")'")
    assert verdict is Verdict.PASS and "99" not in reason, reason


async def test_a_gate_sees_its_leased_gpus_device_nodes_only(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text("")
    nodes = gpu_device_nodes([1, 3], dev=dev)
    assert [n.name for n in nodes] == ["nvidia1", "nvidia3", "nvidiactl", "nvidia-uvm"]
    assert gpu_device_nodes([], dev=dev) == []
    worktree = tmp_path / "wt"
    worktree.mkdir()
    argv = Sandbox.for_step(
        worktree, objects=None, scratch=tmp_path / "scratch", cache=tmp_path / "cache", devices=nodes
    ).argv(["true"])
    bound = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dev-bind-try"]
    assert bound == [str(n) for n in nodes]
    lease = LeaseRecord(lease_id="l1", host="h", gpus=[1, 3])
    assert lease.environment()["CUDA_VISIBLE_DEVICES"] == "1,3"


async def test_what_a_step_adds_to_the_engine_cache_dies_with_it(host: Host, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "tiny.gguf").write_text("weights\n")
    scratch = tmp_path / "scratch"
    sandbox = Sandbox.for_step(host.worktree, objects=None, scratch=scratch, cache=cache)
    ran = subprocess.run(
        sandbox.argv(
            ["/bin/sh", "-c", f"echo poisoned > {cache}/models/tiny.gguf; echo new > {cache}/models/new.gguf;"
             f" cat {cache}/models/tiny.gguf {cache}/models/new.gguf"]
        ),
        env=sandbox.environment("token"), capture_output=True, text=True,
    )  # fmt: skip
    assert ran.stdout.split() == ["weights", "new"], ran.stderr
    assert (cache / "models" / "tiny.gguf").read_text() == "weights\n"
    assert not (cache / "models" / "new.gguf").exists()
    assert (scratch / "cache" / "models" / "new.gguf").read_text() == "new\n"


async def test_on_a_host_without_a_writable_cgroup_the_verdict_says_the_limits_were_not_enforced(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StepCgroup, "make", classmethod(lambda cls, limits, root=None: None))
    result = await ActivityEnvironment().run(
        GateActivities(host.steps).run_gate,
        GateInput(
            ticket_id="t1",
            attempt=1,
            host="local",
            gate=GateSpec.model_validate(
                {
                    "name": "decode",
                    "metric": "decode_tps",
                    "command": f"echo '{MEASUREMENT}'",
                    "threshold": 55,
                }
            ),
        ),
    )
    assert result.verdict is Verdict.PASS
    assert "processes and memory were not limited" in result.evidence["limits"]
