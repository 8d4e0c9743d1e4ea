"""The policy from the command line, against the session's dev server, a real control/host worker process and a
SQLite store: filing under DAEDALUS_POLICY_FILE, the filer refused on their own dispatch, and the last resort,
`daedalus ticket terminate`, whose closing audit event keeps `daedalus audit verify` passing."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from daedalus.devserver import DevServer
from tests.cli.test_ticket_cli import DAEDALUS, daedalus, wait_for_output, write_spec
from tests.support import gate_command
from tests.workflows.test_training import make_spec

GATES = [{"name": "decode", "metric": "decode_tps", "threshold": 20, "command": gate_command()}]


@pytest.fixture
def policy_env(temporal_server: DevServer, tmp_path: Path, task_queue: str) -> dict[str, str]:
    host = f"cli-{task_queue[-8:]}"
    hosts_file = tmp_path / "hosts.yaml"
    hosts_file.write_text(yaml.safe_dump({"hosts": [{"name": host}]}))
    policy_file = tmp_path / "policy.yaml"
    policy = {
        "people": {
            "wayne": {"roles": ["decider"]},
            "bob": {"roles": ["filer"]},
            "olga": {"roles": ["filer", "operator"]},
        },
        "hosts": {host: {"operators": ["olga"]}},
    }
    policy_file.write_text(yaml.safe_dump(policy))
    return {
        **os.environ,
        "DAEDALUS_HOSTS_FILE": str(hosts_file),
        "DAEDALUS_POLICY_FILE": str(policy_file),
        "DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address,
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "DAEDALUS_CONTROL_QUEUE": task_queue,
        "COLUMNS": "250",
    }


@pytest.fixture
def host(policy_env: dict[str, str], task_queue: str) -> Iterator[str]:
    """A control and host worker in its own process, as `daedalus worker` runs on a GPU host."""
    name = f"cli-{task_queue[-8:]}"
    process = subprocess.Popen(
        [DAEDALUS, "worker", "--control", "--host", name], env=policy_env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    yield name
    os.killpg(process.pid, signal.SIGINT)
    process.wait(30)


def test_a_wedged_ticket_is_terminated_with_a_closing_event_and_the_trail_verifies(
    policy_env: dict[str, str], host: str, tmp_path: Path
) -> None:
    ticket_id = f"w{host[-8:]}"
    spec = write_spec(tmp_path, host, ticket_id, agent=None, gates=GATES, approval={})
    filed = daedalus(policy_env, "ticket", "create", "-f", str(spec), "--as", "bob")
    assert filed.returncode == 0, filed.stderr
    shown = wait_for_output(policy_env, ["ticket", "show", ticket_id], "waiting for a decision")
    assert "awaiting_approval" in shown
    request = f"{ticket_id}-dispatch-1"
    own = daedalus(policy_env, "decide", request, "approve", "--as", "bob")
    assert (
        own.returncode == 2
        and "bob filed ticket" in own.stderr
        and "may not decide its dispatch" in own.stderr
    )

    refused = daedalus(policy_env, "ticket", "terminate", ticket_id, "--as", "bob", "--reason", "stuck")
    assert refused.returncode == 2
    assert (
        f"bob may not terminate ticket {ticket_id}: only deciders ['wayne'] and operators of {host}"
        in " ".join(refused.stderr.split())
    )
    done = daedalus(policy_env, "ticket", "terminate", ticket_id, "--as", "wayne", "--reason", "wedged")
    assert done.returncode == 0, done.stderr
    assert f"ticket {ticket_id} terminated by wayne" in done.stdout

    trail = daedalus(policy_env, "audit", "--ticket", ticket_id)
    last = [line for line in trail.stdout.splitlines() if ticket_id in line][-1]
    assert "closed" in last and "wayne" in last and "terminated" in last, trail.stdout
    listed = daedalus(policy_env, "ticket", "list", "--status", "terminated")
    assert ticket_id in listed.stdout
    verified = daedalus(policy_env, "audit", "verify")
    assert verified.returncode == 0 and "every chain and seal intact" in verified.stdout, verified.stdout
    again = daedalus(policy_env, "ticket", "terminate", ticket_id, "--as", "wayne", "--reason", "twice")
    assert again.returncode == 2 and "is not running" in again.stderr


def test_filing_under_the_policy_from_the_command_line(
    policy_env: dict[str, str], host: str, tmp_path: Path
) -> None:
    loose = write_spec(
        tmp_path,
        host,
        f"l{host[-8:]}",
        agent=None,
        gates=GATES,
        approval={"dispatch_requires_approval": False},
    )
    refused = daedalus(policy_env, "ticket", "create", "-f", str(loose), "--as", "bob")
    assert refused.returncode == 2
    assert "approval.dispatch_requires_approval: false would let bob run commands" in " ".join(
        refused.stderr.split()
    )
    stranger = daedalus(policy_env, "ticket", "create", "-f", str(loose), "--as", "mallory")
    said = " ".join(stranger.stderr.split())
    assert stranger.returncode == 2 and "mallory is not in the policy" in said
    assert "if you are not mallory, say who you are with --as <you>" in said
    # The host's operator may file the same spec: it measures at once and passes.
    operated = daedalus(policy_env, "ticket", "create", "-f", str(loose), "--as", "olga")
    assert operated.returncode == 0, operated.stderr
    wait_for_output(policy_env, ["ticket", "show", f"l{host[-8:]}"], "[passed]")


def test_under_a_policy_filing_and_starting_need_a_name(policy_env: dict[str, str], tmp_path: Path) -> None:
    """No unchecked default person (`cli`) under a policy: the command asks who acts, before anything starts."""
    host = f"cli-{policy_env['DAEDALUS_CONTROL_QUEUE'][-8:]}"
    spec = write_spec(tmp_path, host, f"n{host[-8:]}", agent=None, gates=GATES, approval={})
    unnamed = daedalus(policy_env, "ticket", "create", "-f", str(spec))
    assert unnamed.returncode == 2 and "say who acts with --as <person>" in unnamed.stderr, unnamed.stderr
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(make_spec(tmp_path, host=host).model_dump(mode="json")))
    for command in (["train", "start", "-f", str(run_file)], ["train", "stop", "r1"]):
        refused = daedalus(policy_env, *command)
        assert refused.returncode == 2 and "say who acts with --" in refused.stderr, (command, refused.stderr)
