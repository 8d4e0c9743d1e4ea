"""`daedalus train start/status/stop/history` as a person runs them: real processes against the session's dev
server, a `daedalus worker` serving the control queue (SQLite store) and the run's host, a real trainer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from daedalus.cli import app
from daedalus.devserver import DevServer
from daedalus.schemas.training import RestartPolicy
from tests.workflows.test_training import make_spec, trainers

DAEDALUS = str(Path(sys.executable).parent / "daedalus")
SEP = r"[\s│]+"  # between a key and its value in rich's table


@pytest.fixture
def train_env(temporal_server: DevServer, tmp_path: Path, task_queue: str) -> dict[str, str]:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  - name: cli-{task_queue[-8:]}\n")  # the run's host, without GPUs
    return {
        **os.environ,
        "DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address,
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "DAEDALUS_HOSTS_FILE": str(hosts),
        "DAEDALUS_CONTROL_QUEUE": task_queue,
        "COLUMNS": "250",
    }


def daedalus(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DAEDALUS, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def one_line(text: str) -> str:
    """Rich wraps long messages; compare them with the wrapping undone."""
    return " ".join(text.split())


@pytest.fixture
def train_worker(train_env: dict[str, str], task_queue: str) -> Iterator[str]:
    """`daedalus worker --control --host H`: the workflows, the audit store and the run's host queue."""
    host = f"cli-{task_queue[-8:]}"
    process = subprocess.Popen(
        [DAEDALUS, "worker", "--control", "--host", host],
        env=train_env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield host
    os.killpg(process.pid, signal.SIGINT)
    process.wait(30)


def status_until(env: dict[str, str], name: str, pattern: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out = daedalus(env, "train", "status", name)
        if out.returncode == 0 and re.search(pattern, out.stdout):
            return out.stdout
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{pattern!r} never appeared in `train status {name}`:\n{out.stdout}{out.stderr}"
            )
        time.sleep(0.5)


def test_start_status_stop_history_from_the_command_line(
    train_env: dict[str, str], train_worker: str, tmp_path: Path
) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.05", host=train_worker)
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    try:
        started = daedalus(train_env, "train", "start", "-f", str(run_file))
        assert started.returncode == 0, started.stderr
        assert f"started training-{spec.name} on host {train_worker}" in started.stdout

        again = daedalus(train_env, "train", "start", "-f", str(run_file))
        assert again.returncode == 2
        assert f"training run {spec.name} is already running" in one_line(again.stderr)

        out = status_until(train_env, spec.name, rf"trainer pid{SEP}\d+")
        assert re.search(rf"state{SEP}running", out) and re.search(rf"incarnation{SEP}1\b", out)
        (pid,) = [p.pid for p in trainers(spec)]
        assert re.search(rf"trainer pid{SEP}{pid}\b", out)
        assert re.search(rf"memory available now{SEP}0\.\d\d GiB", out)  # the 400 MiB budget less the trainer

        stopped = daedalus(train_env, "train", "stop", spec.name, "--by", "wayne", "--reason", "cli test")
        assert stopped.returncode == 0, stopped.stderr
        assert f"stopping {spec.name} (incarnation 1)" in stopped.stdout
        status_until(train_env, spec.name, rf"state{SEP}stopped")
        assert not trainers(spec)

        history = daedalus(train_env, "train", "history", spec.name)
        assert history.returncode == 0, history.stderr
        (row,) = [line for line in history.stdout.splitlines() if f"{spec.name}#1" in line]
        assert "requested_stop" in row
        assert f"{spec.name}#2" not in history.stdout  # ended: no live incarnation row

        late = daedalus(train_env, "train", "stop", spec.name)
        assert late.returncode == 2
        assert f"training run {spec.name} has already ended (workflow completed)" in one_line(late.stderr)

        # The worker wrote the run's audit trail to the store under DAEDALUS_HOME.
        audit = daedalus(train_env, "audit", "--ticket", spec.workflow_id)
        assert audit.returncode == 0, audit.stderr
        kinds = [line.split("│")[4].strip() for line in audit.stdout.splitlines() if spec.workflow_id in line]
        assert kinds == ["training", "death", "closed"]
        assert "stopped by wayne: cli test" in one_line(audit.stdout)
    finally:
        for proc in trainers(spec):
            proc.kill()


def test_escalation_is_answered_with_train_decide(
    train_env: dict[str, str], train_worker: str, tmp_path: Path
) -> None:
    escalate_at_once = RestartPolicy(restart_delay_s=0.2, escalate_after_deaths=1)
    spec = make_spec(
        tmp_path, "--mib-per-step", "8", "--step-s", "0.05", host=train_worker, restart=escalate_at_once
    )
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    try:
        assert daedalus(train_env, "train", "start", "-f", str(run_file)).returncode == 0
        out = status_until(train_env, spec.name, rf"state{SEP}awaiting_decision")
        assert f"hunt-{spec.name}-1" in out

        wrong = daedalus(train_env, "train", "decide", spec.name, "maybe", "--as", "wayne")
        assert wrong.returncode == 2 and "unknown option 'maybe'" in one_line(wrong.stderr)
        stranger = daedalus(train_env, "train", "decide", spec.name, "stop", "--as", "codex")
        assert stranger.returncode == 2 and "codex may not decide escalation" in one_line(stranger.stderr)

        decided = daedalus(train_env, "train", "decide", spec.name, "stop", "--as", "wayne", "--note", "leak")
        assert decided.returncode == 0, decided.stderr
        assert f"wayne chose 'stop' for training run {spec.name}" in decided.stdout
        status_until(train_env, spec.name, rf"state{SEP}stopped")
        history = daedalus(train_env, "train", "history", spec.name).stdout
        (row,) = [line for line in history.splitlines() if f"{spec.name}#1" in line]
        assert "watchdog_stop" in row
        late = daedalus(train_env, "train", "decide", spec.name, "restart", "--as", "wayne")
        assert late.returncode == 2
        assert f"training run {spec.name} is not waiting for a decision" in one_line(late.stderr)
    finally:
        for proc in trainers(spec):
            proc.kill()


def test_bad_run_files_exit_2_with_a_clear_message_and_start_nothing(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    """In-process (typer's CliRunner) for speed: the same app, the same exit codes, the real dev server."""
    runner = CliRunner()
    env = {"DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address, "DAEDALUS_HOME": str(tmp_path / "home")}
    spec = make_spec(tmp_path)
    good = spec.model_dump(mode="json", exclude_defaults=True)
    cases: list[tuple[str, str, str]] = [
        ("syntax.yaml", f"name: {spec.name}\ncommand: [python, 'unclosed\n", "not valid YAML"),
        (
            "list.yaml",
            "- name\n- host\n",
            "a run file is a mapping of fields (name, host, command, ...), got list",
        ),
        (
            "keep0.yaml",
            yaml.safe_dump({**good, "checkpoints": {**good["checkpoints"], "keep": 0}}),
            "invalid training run: checkpoints.keep: Input should be greater than or equal to 1",
        ),
        (
            "typo.yaml",
            yaml.safe_dump({**good, "watchdg": {"min_available_gib": 14}}),
            "invalid training run: watchdg: Extra inputs are not permitted",
        ),
        (
            "threshold.yaml",
            yaml.safe_dump({**good, "watchdog": {**good["watchdog"], "min_available_gib": 1.0}}),
            "is not below budget_mib 400 MiB",
        ),
    ]
    for file_name, text, message in cases:
        path = tmp_path / file_name
        path.write_text(text)
        result = runner.invoke(app, ["train", "start", "-f", str(path)], env=env)
        assert result.exit_code == 2, (file_name, result.output)
        assert message in one_line(result.stderr), (file_name, result.stderr)
        assert file_name in one_line(result.stderr).replace(" ", "")  # the message names the file
        assert result.exception is None or isinstance(result.exception, SystemExit)
        assert result.stdout == ""

    missing = runner.invoke(app, ["train", "start", "-f", str(tmp_path / "nope.yaml")], env=env)
    assert missing.exit_code == 2 and "cannot read the run file" in one_line(missing.stderr)

    # Nothing started: Temporal has no workflow training-<name>.
    unknown = runner.invoke(app, ["train", "status", spec.name], env=env)
    assert unknown.exit_code == 2, unknown.output
    assert f"no training run named {spec.name}" in one_line(unknown.stderr)
