"""`daedalus campaign start` under the policy: only an operator of the campaign's host starts one (its cells run
there with no dispatch decision), `--as` must be said, and a shared stack refuses it (its API has no campaign
route), each before anything reaches Temporal."""

from __future__ import annotations

from pathlib import Path

import yaml
from temporalio.client import Client

from daedalus.schemas.campaigns import campaign_workflow_id
from tests.cli.test_policy_cli import policy_env
from tests.cli.test_ticket_cli import daedalus

__all__ = ["policy_env"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "campaigns"


def campaign_file(tmp_path: Path, host: str, campaign_id: str) -> Path:
    spec = yaml.safe_load((EXAMPLES / "local-wall.yaml").read_text())
    spec.update(id=campaign_id, host=host)
    path = tmp_path / f"{campaign_id}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


async def test_only_an_operator_of_the_host_starts_a_campaign_under_the_policy(
    policy_env: dict[str, str], temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    host = f"cli-{task_queue[-8:]}"
    campaign_id = f"c{task_queue[-8:]}"
    spec = str(campaign_file(tmp_path, host, campaign_id))
    unnamed = daedalus(policy_env, "campaign", "start", "-f", spec)
    assert unnamed.returncode == 2 and "--as <you>" in unnamed.stderr, unnamed.stderr
    stranger = daedalus(policy_env, "campaign", "start", "-f", spec, "--as", "bob")
    assert stranger.returncode == 2, stranger.stderr
    said = " ".join(stranger.stderr.split())  # the error console wraps long lines
    assert f"ask an operator of {host} to start it (operators: ['olga'])" in said
    shared = {**policy_env, "DAEDALUS_API_URL": "http://127.0.0.1:9", "DAEDALUS_API_TOKEN": "dtk_x"}
    remote = daedalus(shared, "campaign", "start", "-f", spec, "--as", "olga")
    assert remote.returncode == 2 and "no campaign route" in " ".join(remote.stderr.split()), remote.stderr
    workflow_id = campaign_workflow_id(campaign_id)
    assert [w async for w in temporal_client.list_workflows(f"WorkflowId = '{workflow_id}'")] == []

    started = daedalus(policy_env, "campaign", "start", "-f", spec, "--as", "olga")
    assert started.returncode == 0, started.stderr
    handle = temporal_client.get_workflow_handle(workflow_id)
    history = await handle.fetch_history()
    first = history.events[0].workflow_execution_started_event_attributes.input.payloads[0].data
    assert b'"filed_by":"olga"' in first
    await handle.terminate("test over")
