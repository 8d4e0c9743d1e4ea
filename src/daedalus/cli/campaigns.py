"""`daedalus campaign ...`: start a campaign from a spec file and follow it; answer it with `daedalus decide`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from temporalio.client import WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from daedalus.cli import _common
from daedalus.cli._common import client, console, fail, run
from daedalus.escaping import for_terminal
from daedalus.schemas import search_attributes
from daedalus.schemas.campaigns import CampaignInput, CampaignStatus, campaign_workflow_id
from daedalus.schemas.ui import campaign_summary
from daedalus.workflows.campaign import CampaignWorkflow

app = typer.Typer(
    add_completion=False, help="Sweep presets x workloads on a host and propose the best preset."
)


@app.command()
def start(
    file: Annotated[Path, typer.Option("-f", "--file", help="campaign spec (YAML), see examples/campaigns/")],
    as_: Annotated[
        str | None, typer.Option("--as", help="who starts it; required under a policy (else `lead`)")
    ] = None,
) -> None:
    """Start `campaign-<id>`; its cells run on the host's worker, one after another, each under a lease on
    all the GPUs hosts.yaml declares for the host. Under a policy, only an operator of the host may start one
    (its cells run there without a dispatch decision)."""
    from daedalus.campaigns.spec import CampaignSpecError, load_campaign
    from daedalus.hosts.registry import RegistryError, load_registry

    settings = _common.settings()
    if settings.api.url is not None:
        fail(
            f"campaigns cannot be started through the shared stack's API at {settings.api.url} (it has no "
            f"campaign route); ask an operator of the campaign's host to start it on the stack itself"
        )
    try:
        spec = load_campaign(file)
    except CampaignSpecError as error:
        fail(str(error))
    try:
        host = load_registry(settings.hosts_file).host(spec.host)
    except RegistryError as error:
        fail(f"{file}: {error}")
    policy = _common.policy()
    if policy is None:
        filed_by = as_ or "lead"
    elif as_ is None:
        fail(f"a policy is configured: say who starts campaign {spec.id} with --as <you>")
    elif not policy.operates(as_, spec.host):
        fail(
            f"{as_} does not operate {spec.host} in the policy, and a campaign's cells run on it without a "
            f"dispatch decision; ask an operator of {spec.host} to start it "
            f"(operators: {policy.hosts[spec.host].operators if spec.host in policy.hosts else []})"
        )
    else:
        filed_by = as_.lower()
    from daedalus.services.questions import read_rulings, ruled_out_presets

    # presets a standing ruling forbids are measured like the others and never proposed
    ruled_out = ruled_out_presets(spec, read_rulings(_common.store(settings)))
    for preset, why in ruled_out.items():
        console.print(f"never proposed: {for_terminal(preset)}: {for_terminal(why)}", highlight=False)

    async def go() -> str:
        handle: WorkflowHandle[CampaignWorkflow, CampaignStatus] = await (
            await client(settings)
        ).start_workflow(
            CampaignWorkflow.run,
            CampaignInput(
                spec=spec,
                control_queue=settings.temporal.control_queue,
                filed_by=filed_by,
                host_gpus=host.gpus.count,
                ruled_out=ruled_out,
            ),
            id=campaign_workflow_id(spec.id),
            task_queue=settings.temporal.control_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            search_attributes=search_attributes.on_host(spec.host),
            static_summary=campaign_summary(spec),
        )
        return handle.id

    try:
        workflow_id = run(go())
    except WorkflowAlreadyStartedError:
        fail(
            f"campaign {spec.id} is already running (workflow {campaign_workflow_id(spec.id)}); use another id"
        )
    console.print(
        f"campaign {for_terminal(spec.id)} started ({workflow_id}): {len(spec.cells())} cells on {spec.host}"
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
        f"campaign {for_terminal(campaign_id)}: {state.status}; {state.cells_done}/{state.cells_total} cells, "
        f"{state.cells_crashed} crashed"
    )
    if state.proposal is not None:
        console.print(
            f"proposal: {for_terminal(state.proposal.preset or 'none')} — {for_terminal(state.proposal.reason)}"
        )
        if state.status == "awaiting_decision":
            console.print(
                f"answer with: daedalus decide campaign-{campaign_id}-escalation-1 adopt --as <decider>"
            )


@app.command()
def cancel(
    campaign_id: str,
    reason: Annotated[str, typer.Option(help="why, kept in the closing audit event")],
    as_: Annotated[
        str | None, typer.Option("--as", help="who cancels: a decider of it, or who started it")
    ] = None,
) -> None:
    """Stop a running campaign after the cell it is measuring, or its waiting proposal; the trail says who and why."""
    from pydantic import ValidationError

    from daedalus.errors import RequestRefused
    from daedalus.schemas.ticket import CancelRequest
    from daedalus.services import campaigns

    try:
        request = CancelRequest(requested_by=(as_ or "lead").lower(), reason=reason)
    except ValidationError as error:
        fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()))

    async def go() -> CampaignStatus:
        return await campaigns.cancel(await client(), campaign_id, request)

    try:
        state = run(go())
    except RequestRefused as error:
        fail(str(error))
    console.print(
        f"campaign {for_terminal(campaign_id)}: cancel requested by {request.requested_by}; it stops after the "
        f"current cell ({state.cells_done}/{state.cells_total} done)"
    )
