"""CampaignWorkflow (`campaign-<id>`): sweep a matrix of presets x workloads on one host and propose a preset.

Each cell is measured on the host's queue, one after another (cells on one host must not share it), and stored
as it lands, so the report shows a campaign in progress. A crashed cell is a finding. At the end the Pareto-best
eligible preset is proposed to the decider as a decision; the answer closes the campaign.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from daedalus.campaigns.decision import ADOPT, adoption_request
    from daedalus.campaigns.pareto import propose
    from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord
    from daedalus.schemas.campaigns import (
        CampaignInput,
        CampaignRecord,
        CampaignSpec,
        CampaignStatus,
        CellInput,
        CellOutcome,
        CellResult,
        Proposal,
        campaign_workflow_id,
    )
    from daedalus.schemas.notify import NotifyResult
    from daedalus.schemas.ticket import Decision, DecisionRequest, host_queue

STORE_TIMEOUT = timedelta(seconds=30)


@workflow.defn
class CampaignWorkflow:
    def __init__(self) -> None:
        self.spec_id = ""
        self.state = "starting"
        self.cells: list[CellResult] = []
        self.total = 0
        self.proposal: Proposal | None = None
        self.request: DecisionRequest | None = None
        self.answer: Decision | None = None
        self.seq = 0

    @workflow.query
    def status(self) -> CampaignStatus:
        return CampaignStatus(
            campaign_id=self.spec_id,
            status=self.state,
            cells_total=self.total,
            cells_done=len(self.cells),
            cells_crashed=sum(c.outcome is CellOutcome.CRASHED for c in self.cells),
            proposal=self.proposal,
            decision=self.answer.option if self.answer else None,
        )

    @workflow.update
    def decide(self, decision: Decision) -> CampaignStatus:
        """Answer the proposal; the validator has checked the request id, the option and the decider."""
        self.answer = decision
        return self.status()

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        if self.request is None or self.answer is not None:
            raise ValueError(f"campaign {self.spec_id} is not waiting for a decision ({self.state})")
        refusal = self.request.refusal(decision, f"campaign {self.spec_id}")
        if refusal is not None:
            raise ValueError(refusal)

    @workflow.run
    async def run(self, request: CampaignInput) -> CampaignStatus:
        spec = request.spec
        self.spec_id = spec.id
        control = request.control_queue or workflow.info().task_queue
        cells = spec.cells()
        self.total = len(cells)
        self.state = "running"
        provenance = {
            "harness": "daedalus.engines.measure + gates.verdicts",
            "host": spec.host,
            "base_preset": spec.base_preset,
            "model": spec.model,
            "filed_by": request.filed_by,
            "workflow_id": workflow.info().workflow_id,
        }
        await self._store(spec, control, [], provenance=provenance)
        await self._audit(
            spec.id,
            control,
            AuditKind.FILED,
            f"campaign of {len(cells)} cells on {spec.host}",
            actor=request.filed_by,
        )
        for cell in cells:
            try:
                result = await workflow.execute_activity(
                    "measure_campaign_cell",
                    CellInput(
                        campaign_id=spec.id,
                        spec=spec,
                        cell=cell,
                        filing=workflow.info().first_execution_run_id,
                    ),
                    result_type=CellResult,
                    task_queue=host_queue(spec.host),
                    start_to_close_timeout=timedelta(seconds=spec.cell_timeout_s),
                    heartbeat_timeout=timedelta(seconds=60),
                    retry_policy=RetryPolicy(maximum_attempts=2),
                )
            except ActivityError as error:
                # the harness itself broke (not the engine): the cell is INVALID, the sweep goes on
                cause = str(error.cause) if error.cause is not None else str(error)
                result = CellResult(
                    cell=cell,
                    preset=cell.preset_name,
                    label=spec.label(cell.kv),
                    outcome=CellOutcome.INVALID,
                    detail=f"measurement failed: {cause}"[:300],
                    measured_at=workflow.now(),
                )
            self.cells.append(result)
            await self._store(spec, control, [result])
        proposal, eligible = propose(spec, self.cells)
        self.proposal = proposal
        crashed = sum(c.outcome is CellOutcome.CRASHED for c in self.cells)
        if proposal.preset is None:
            self.state = "no_proposal"
            await self._store(spec, control, [], proposal=proposal, eligible=eligible)
            await self._audit(spec.id, control, AuditKind.CLOSED, f"no proposal: {proposal.reason}")
            return self.status()
        # the request is in the store (and Slack) before the status query says a decision is awaited
        self.state = "proposing"
        self.request = adoption_request(
            spec, proposal, at=workflow.now(), cells=len(self.cells), crashed=crashed
        )
        await self._store(spec, control, [], proposal=proposal, eligible=eligible, status="awaiting_decision")
        await self._audit(
            spec.id,
            control,
            AuditKind.DECISION_REQUESTED,
            self.request.question,
            decision_request=self.request,
            status="awaiting_decision",
        )
        await workflow.execute_activity(
            "notify_decision_request",
            self.request,
            result_type=NotifyResult,
            task_queue=control,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
        self.state = "awaiting_decision"
        await workflow.wait_condition(lambda: self.answer is not None)
        assert self.answer is not None
        self.state = "adopted" if self.answer.option == ADOPT else "rejected"
        await self._audit(
            spec.id,
            control,
            AuditKind.DECIDED,
            f"{self.answer.decided_by} chose {self.answer.option} for {proposal.preset}",
            actor=self.answer.decided_by,
            decision=self.answer,
        )
        await self._store(spec, control, [], proposal=proposal, eligible=eligible)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    async def _store(
        self,
        spec: CampaignSpec,
        control: str,
        cells: list[CellResult],
        *,
        proposal: Proposal | None = None,
        eligible: set[str] | None = None,
        provenance: dict[str, str] | None = None,
        status: str | None = None,
    ) -> None:
        record = CampaignRecord(
            campaign_id=self.spec_id,
            spec=spec,
            status=status or self.state,
            at=workflow.now(),
            cells=cells,
            proposal=proposal,
            eligible=sorted(eligible or ()),
            provenance=provenance or {},
        )
        await workflow.execute_activity(
            "record_campaign", record, task_queue=control, start_to_close_timeout=STORE_TIMEOUT
        )

    async def _audit(
        self,
        campaign_id: str,
        control: str,
        kind: AuditKind,
        summary: str,
        *,
        actor: str = "daedalus",
        decision_request: DecisionRequest | None = None,
        decision: Decision | None = None,
        status: str | None = None,
    ) -> None:
        self.seq += 1
        info = workflow.info()
        record = AuditRecord(
            event=AuditEvent(
                workflow_id=info.workflow_id,
                run_id=info.first_execution_run_id,
                seq=self.seq,
                ticket_id=campaign_workflow_id(campaign_id),
                kind=kind,
                actor=actor.lower(),
                at=workflow.now(),
                status=status or self.state,
                summary=summary,
            ),
            decision_request=decision_request,
            decision=decision,
        )
        await workflow.execute_activity(
            "record_audit_event",
            record,
            result_type=bool,
            task_queue=control,
            start_to_close_timeout=STORE_TIMEOUT,
        )
