"""CampaignWorkflow (`campaign-<id>`): sweep a matrix of presets x workloads on one host and propose a preset.

Each cell is measured on the host's queue, one after another (cells on one host must not share it), under a
lease on all the host's GPUs when it declares any, and stored as it lands, so the report shows a campaign in
progress. A crashed cell is a finding; a refused lease or a broken harness makes the cell INVALID. At the end the
Pareto-best eligible preset is proposed to the deciders through the decision desk (Slack, reminders, the
authority check) and the answer closes the campaign. Every transition is an event of its audit trail (subject
`campaign-<id>`), like a ticket's.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from daedalus.campaigns.decision import proposal_question
    from daedalus.campaigns.pareto import propose
    from daedalus.decisions.desk import DecisionDesk, Waiting
    from daedalus.decisions.schemas import (
        CampaignProposalOption,
        CampaignSubject,
        Decision,
        DecisionKind,
        DecisionRequest,
        DeskState,
    )
    from daedalus.hosts.leases import LeaseRequest
    from daedalus.ids import host_queue, lease_id_for
    from daedalus.schemas.audit import AuditKind
    from daedalus.schemas.campaigns import (
        CampaignCell,
        CampaignInput,
        CampaignRecord,
        CampaignStatus,
        CellInput,
        CellOutcome,
        CellResult,
        Proposal,
        campaign_workflow_id,
    )
    from daedalus.schemas.ticket import CancelRequest
    from daedalus.workflows.lease_helpers import holding_lease
    from daedalus.workflows.trail import AuditTrail

STORE_TIMEOUT = timedelta(seconds=30)
REMINDERS_PATCH = "campaign-proposal-reminders"
"""The waiting proposal is reminded (a timer); histories recorded before it wait without one."""
CLOSED_STATES = ("adopted", "rejected", "no_proposal", "cancelled")
CELL_LEASE_PRIORITY = 40
"""Below a ticket's gate (50): a sweep of many cells yields the GPUs between its cells to a ticket waiting."""


@workflow.defn
class CampaignWorkflow:
    @workflow.init
    def __init__(self, request: CampaignInput) -> None:
        self.spec = request.spec
        self.state = "starting"
        self.cells: list[CellResult] = []
        self.total = 0
        self.proposal: Proposal | None = None
        self.answer: Decision | None = None
        self.cancel_request: CancelRequest | None = None
        self.filed_by = request.filed_by
        self.trail: AuditTrail[str] = AuditTrail(
            campaign_workflow_id(self.spec.id), status=lambda: self.state, view=lambda seq: self.state
        )
        self.desk = DecisionDesk(
            CampaignSubject(campaign=self.spec.id),
            campaign_workflow_id(self.spec.id),
            self.trail,
            DeskState(),
            deciders=lambda: self.spec.deciders,
        )
        self.trail.begin()

    @workflow.query
    def status(self) -> CampaignStatus:
        """Cells as they land; the state (and so a pending decision) only once its audit event is written."""
        return CampaignStatus(
            campaign_id=self.spec.id,
            status=self.trail.written,
            cells_total=self.total,
            cells_done=len(self.cells),
            cells_crashed=self._crashed(),
            proposal=self.proposal,
            decision=self.answer.option if self.answer else None,
        )

    @workflow.query
    def pending_decision(self) -> DecisionRequest | None:
        """The request awaiting an answer, for the service layer's authority policy."""
        return self.desk.pending

    @workflow.update
    def decide(self, decision: Decision) -> CampaignStatus:
        """Answer the proposal; the validator has checked the request id, the option and the decider. The
        campaign's state moves now, so the `decided` event carries it (and the status query shows it once written)."""
        self.answer = decision
        self._show("adopted" if decision.option == CampaignProposalOption.ADOPT else "rejected")
        self.desk.answer(decision)
        return self.status()

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        self.desk.validate(decision, self.state)

    @workflow.update
    def cancel(self, request: CancelRequest) -> CampaignStatus:
        """Stop after the cell being measured (or the waiting proposal); the close records who and why."""
        self.cancel_request = request
        return self.status()

    @cancel.validator
    def _validate_cancel(self, request: CancelRequest) -> None:
        if self.state in CLOSED_STATES or self.cancel_request is not None:
            raise ValueError(f"campaign {self.spec.id} is already {self.state.replace('_', ' ')}")
        allowed = [*self.spec.deciders, self.filed_by]
        if request.requested_by not in allowed:
            raise ValueError(
                f"{request.requested_by} may not cancel campaign {self.spec.id}; allowed: its deciders and "
                f"whoever started it: {allowed}"
            )

    @workflow.run
    async def run(self, request: CampaignInput) -> CampaignStatus:
        spec = self.spec
        control = request.control_queue or workflow.info().task_queue
        cells = spec.cells()
        self.total = len(cells)
        self._show("running")
        provenance = {
            "harness": "daedalus.engines.measure + gates.verdicts",
            "host": spec.host,
            "base_preset": spec.base_preset,
            "model": spec.model,
            "filed_by": request.filed_by,
            "workflow_id": workflow.info().workflow_id,
        }
        if request.host_gpus:
            provenance["gpus"] = f"each cell under a lease on all {request.host_gpus} GPUs of {spec.host}"
        await self._store(control, [], provenance=provenance)
        await self.trail.record(
            AuditKind.FILED, f"campaign of {len(cells)} cells on {spec.host}", actor=request.filed_by
        )
        for cell in cells:
            if self.cancel_request is not None:
                return await self._cancelled(control)
            result = await self._measure(cell, request.host_gpus)
            self.cells.append(result)
            self._show("running")
            await self._store(control, [result])
        proposal, eligible = propose(spec, self.cells, request.ruled_out)
        self.proposal = proposal
        if proposal.preset is None:
            self._show("no_proposal")
            await self._store(control, [], proposal=proposal, eligible=eligible)
            await self.trail.record(AuditKind.CLOSED, f"no proposal: {proposal.reason}")
            return self.status()
        # the request is in the store (and Slack) before the status query says a decision is awaited
        self._show("proposing")
        await self._store(control, [], proposal=proposal, eligible=eligible, status="awaiting_decision")
        question, evidence = proposal_question(spec, proposal, cells=len(self.cells), crashed=self._crashed())
        reminders = spec.reminder_interval_s if workflow.patched(REMINDERS_PATCH) else None
        answer = await self.desk.ask(
            DecisionKind.ESCALATION,  # the id grammar `daedalus decide` knows: campaign-<id>-escalation-1
            question,
            CampaignProposalOption,
            evidence,
            Waiting(
                reminder=timedelta(seconds=reminders) if reminders else None,
                interrupted=lambda: self.cancel_request is not None,
            ),
            ticket_id=campaign_workflow_id(spec.id),
            before_write=lambda _: self._show("awaiting_decision"),
        )
        if answer is None:  # only its cancellation interrupts the wait
            return await self._cancelled(control, proposal)
        await self._store(control, [], proposal=proposal, eligible=eligible)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    async def _cancelled(self, control: str, proposal: Proposal | None = None) -> CampaignStatus:
        request = self.cancel_request
        if request is None:
            raise ApplicationError(
                "a campaign closed as cancelled without a cancel request", non_retryable=True
            )
        self.desk.withdraw()
        self._show("cancelled")
        await self._store(control, [], proposal=proposal)
        await self.trail.record(
            AuditKind.CLOSED,
            f"cancelled by {request.requested_by} after {len(self.cells)}/{self.total} cells: {request.reason}",
            actor=request.requested_by,
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    async def _measure(self, cell: CampaignCell, host_gpus: int) -> CellResult:
        """One cell on the host, under a lease on its GPUs when it has any; a refused lease or a broken
        harness is an INVALID cell (the engine never ran, or its figures cannot be trusted), never an error."""
        spec = self.spec
        self._show("running", f"measuring cell `{cell.key}`")
        try:
            if not host_gpus:
                return await self._cell(cell, None)
            lease = LeaseRequest(
                lease_id=lease_id_for(workflow.info().workflow_id, cell.key),
                holder=f"campaign {spec.id} cell {cell.key}",
                purpose="benchmark",
                count=host_gpus,
                priority=CELL_LEASE_PRIORITY,
            )
            async with holding_lease(spec.host, lease) as held:
                return await self._cell(cell, held.gpus)
        except ActivityError as error:
            cause = str(error.cause) if error.cause is not None else str(error)
            return CellResult(
                cell=cell,
                preset=cell.preset_name,
                label=spec.label(cell.kv),
                outcome=CellOutcome.INVALID,
                detail=f"measurement failed: {cause}"[:300],
                measured_at=workflow.now(),
            )

    async def _cell(self, cell: CampaignCell, gpus: list[int] | None) -> CellResult:
        spec = self.spec
        return await workflow.execute_activity(
            "measure_campaign_cell",
            CellInput(
                campaign_id=spec.id,
                spec=spec,
                cell=cell,
                filing=workflow.info().first_execution_run_id,
                gpus=gpus,
            ),
            result_type=CellResult,
            task_queue=host_queue(spec.host),
            start_to_close_timeout=timedelta(seconds=spec.cell_timeout_s),
            heartbeat_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=2),
            summary=f"cell {cell.key}" + (f" on GPUs {gpus}" if gpus else ""),
        )

    def _crashed(self) -> int:
        return sum(c.outcome is CellOutcome.CRASHED for c in self.cells)

    def _show(self, state: str, now: str = "") -> None:
        """The campaign's state, and its current details in the Temporal UI."""
        self.state = state
        lines = [
            f"### campaign {self.spec.id}: {self.spec.title}",
            f"**{state.replace('_', ' ')}** on {self.spec.host}: {len(self.cells)}/{self.total} cells, "
            f"{self._crashed()} crashed",
        ]
        if self.proposal is not None:
            lines.append(f"proposal: {self.proposal.preset or 'none'} ({self.proposal.reason})")
        if self.desk.pending is not None:
            lines.append(f"waiting for {', '.join(self.desk.pending.allowed)}")
        if now:
            lines.append(now)
        workflow.set_current_details("\n\n".join(lines))

    async def _store(
        self,
        control: str,
        cells: list[CellResult],
        *,
        proposal: Proposal | None = None,
        eligible: set[str] | None = None,
        provenance: dict[str, str] | None = None,
        status: str | None = None,
    ) -> None:
        record = CampaignRecord(
            campaign_id=self.spec.id,
            spec=self.spec,
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
