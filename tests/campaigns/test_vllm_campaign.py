"""A campaign on vLLM's CPU build (issue 31 item 7): the seed's speculative-length search, cut to two cells of
examples/campaigns/local-vllm-spec-search.yaml (plain decoding and n-gram k=3 with a 2-4 lookup window), on the
real dev server, store and workers. Each cell is one vLLM start: its decode rounds and acceptance, the needle, and
temp-0 identity judged against the plain cell's streams; the report shows the table with both. About 3 minutes.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus import services as tickets
from daedalus.campaigns.spec import load_campaign
from daedalus.engines.hf_tiny_model import ensure_hf_model
from daedalus.engines.vllm_env import installed_environment
from daedalus.errors import EngineSetupError
from daedalus.report import build_report, render_markdown
from daedalus.schemas.campaigns import CampaignAxes, CampaignInput, campaign_workflow_id
from daedalus.schemas.ticket import Decision
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.campaign import CampaignWorkflow
from tests.campaigns.test_campaign_workflow import wait_status
from tests.support import running_workers

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "campaigns" / "local-vllm-spec-search.yaml"


@pytest.mark.timeout(900)
async def test_seed_speculative_length_search_on_vllm(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    try:
        ensure_hf_model("tiny-llama", environment=installed_environment())
    except EngineSetupError as error:
        pytest.fail(f"{error} (the vLLM tests run vLLM's CPU build for real; `make test` installs it)")
    host = f"hv-{task_queue[-8:]}"
    example = load_campaign(EXAMPLE)
    axes = CampaignAxes(kv=["auto"], context=[1024], users=[1], speculative_k=[0, 3], lookup=[(2, 4)])
    spec = example.model_copy(update={"host": host, "id": f"v-{task_queue[-8:]}", "axes": axes})
    assert [c.key for c in spec.cells()] == [
        "kv=auto/context=1024/users=1",
        "kv=auto/context=1024/users=1/k=3/lookup=2-4",
    ]
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await temporal_client.start_workflow(
            CampaignWorkflow.run,
            CampaignInput(spec=spec, control_queue=task_queue),
            id=campaign_workflow_id(spec.id),
            task_queue=task_queue,
        )
        status = await wait_status(handle, "awaiting_decision", limit=840)
        await tickets.decide(
            temporal_client,
            Decision(request_id=f"campaign-{spec.id}-escalation-1", option="reject", decided_by="wayne"),
            store=sqlite_engine,
        )
        assert (await handle.result()).status == "rejected"
    assert status.cells_done == 2 and status.cells_crashed == 0
    with session_scope(sqlite_engine) as session:
        plain, speculative = queries.campaign_cells(session=session, campaign_id=spec.id)
    for cell in (plain, speculative):
        assert cell.outcome == "measured", (cell.cell, cell.detail)
        assert cell.decode_tps is not None and cell.ci_low is not None and len(cell.samples) == spec.rounds
        assert cell.needle_total == 6, cell.needle_total
    # The plain cell is its own identity baseline; the speculative one is judged against its streams.
    assert (plain.evidence["identity_passed"], plain.evidence["identity_total"]) == ("8", "8")
    assert "acceptance_length" not in plain.evidence
    accepted = float(speculative.evidence["acceptance_length"])
    assert 1.0 <= accepted <= 4.0  # k = 3: at most 4 tokens a verification step
    assert speculative.evidence["identity_total"] == "8"
    passed = int(speculative.evidence["identity_passed"])
    assert "identical" in speculative.evidence["temp0_identity"]
    # Eligibility follows the identity rule: a speculative cell is eligible only with every probe passing.
    assert speculative.feasible == (passed == 8) or not plain.feasible
    with session_scope(sqlite_engine) as session:
        report = render_markdown(build_report(session=session, since=datetime.now(UTC) - timedelta(hours=1)))
    table = next(line for line in report.splitlines() if "| acceptance length | temp-0 identity |" in line)
    assert table
    row = next(line for line in report.splitlines() if "k 3, lookup 2-4" in line)
    assert f"| {passed}/8 |" in row and f"{accepted:.3g}"[:3] in row, row
    print(f"\n{row}\n" + next(line for line in report.splitlines() if "context 1024, users 1 |" in line),
          file=sys.stderr)  # fmt: skip
