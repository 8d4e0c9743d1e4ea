"""`daedalus campaign ...`: start a campaign from a spec file and follow it; answer it with `daedalus decide`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from temporalio.client import WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from daedalus.cli import _common
from daedalus.cli._common import client, console, fail, run
from daedalus.schemas.campaigns import CampaignInput, CampaignStatus, campaign_workflow_id
from daedalus.workflows.campaign import CampaignWorkflow

app = typer.Typer(
    add_completion=False, help="Sweep presets x workloads on a host and propose the best preset."
)


@app.command()
def start(
    file: Annotated[Path, typer.Option("-f", "--file", help="campaign spec (YAML), see examples/campaigns/")],
    as_: Annotated[str, typer.Option("--as", help="who files it")] = "lead",
) -> None:
    """Start `campaign-<id>`; its cells run on the host's worker, one after another, each under a lease on
    all the GPUs hosts.yaml declares for the host."""
    from daedalus.campaigns.spec import CampaignSpecError, load_campaign
    from daedalus.hosts.registry import RegistryError, load_registry

    try:
        spec = load_campaign(file)
    except CampaignSpecError as error:
        fail(str(error))
    settings = _common.settings()
    try:
        host = load_registry(settings.hosts_file).host(spec.host)
    except RegistryError as error:
        fail(f"{file}: {error}")

    async def go() -> str:
        handle: WorkflowHandle[CampaignWorkflow, CampaignStatus] = await (
            await client(settings)
        ).start_workflow(
            CampaignWorkflow.run,
            CampaignInput(
                spec=spec,
                control_queue=settings.temporal.control_queue,
                filed_by=as_,
                host_gpus=host.gpus.count,
            ),
            id=campaign_workflow_id(spec.id),
            task_queue=settings.temporal.control_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
        return handle.id

    try:
        workflow_id = run(go())
    except WorkflowAlreadyStartedError:
        fail(
            f"campaign {spec.id} is already running (workflow {campaign_workflow_id(spec.id)}); use another id"
        )
    console.print(
        f"campaign {escape(spec.id)} started ({workflow_id}): {len(spec.cells())} cells on {spec.host}"
    )


@app.command()
def status(campaign_id: str) -> None:
    """Cells done and crashed, and the proposal once every cell is in."""

    async def go() -> CampaignStatus:
        handle = (await client()).get_workflow_handle(campaign_workflow_id(campaign_id))
        result: CampaignStatus = await handle.query(CampaignWorkflow.status)
        return result

    try:
        state = run(go())
    except RPCError as error:
        fail(f"campaign {campaign_id}: {error.message}")
    console.print(
        f"campaign {escape(campaign_id)}: {state.status}; {state.cells_done}/{state.cells_total} cells, "
        f"{state.cells_crashed} crashed"
    )
    if state.proposal is not None:
        console.print(
            f"proposal: {escape(state.proposal.preset or 'none')} — {escape(state.proposal.reason)}"
        )
        if state.status == "awaiting_decision":
            console.print(
                f"answer with: daedalus decide campaign-{campaign_id}-escalation-1 adopt --as <decider>"
            )
