"""A ticket's host steps: the agent's attempt, the build and the gates, each run on the ticket's host.

Each returns what the ticket needs to decide (an attempt summary, a gate result); a step that failed on the
host after its retries becomes such a result too (AGENT_FAILED, a failed build, an INVALID gate), never a
crash of the ticket. Build and gate events are written here; the attempt's event is the workflow's, because
its projection counts the attempt.

A step the host itself could not run raises `HostProblem` instead: no worker took it within the host's
schedule-to-start limit, the host's environment is broken (engine repo unreachable, commit missing), or its
GPUs could not be leased. The ticket spends no attempt on it and asks the decider, with what to fix.

A gate on a host with GPUs runs under a lease on all of them from the host's lease keeper (an A/B gate measures
both arms in its one command, so both arms run under the one lease); the verdict records the lease.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import RUN_ATTEMPT, RUN_BUILD, RUN_GATE
    from daedalus.errors import BrokenInvariant
    from daedalus.hosts.leases import LeaseRequest
    from daedalus.ids import host_queue, lease_id_for, ticket_workflow_id
    from daedalus.schemas.agents import ExitReason
    from daedalus.schemas.audit import AuditKind
    from daedalus.schemas.gates import GateKind, GateResult, GateSpec, LeaseRecord, Verdict
    from daedalus.schemas.steps import AttemptInput, BuildInput, BuildResult, GateInput
    from daedalus.schemas.ticket import AttemptOutcome, AttemptSummary, EngineRef, HostFacts, TicketSpec
    from daedalus.schemas.ui import gate_activity_summary
    from daedalus.workflows import ticket_rules as rules
    from daedalus.workflows.lease_helpers import holding_lease
    from daedalus.workflows.patches import PatchesAtStart
    from daedalus.workflows.steps import StepFailed, StepFailure, Steps
    from daedalus.workflows.ticket_lessons import TicketLessons
    from daedalus.workflows.ticket_ui import TicketUi
    from daedalus.workflows.trail import AuditTrail

ATTEMPT_TIMEOUT = timedelta(hours=6)

HOST_PROBLEMS_ASK = "host-problems-ask-the-decider"
"""Patch: a step the host could not run asks the decider and spends no attempt (before it, an environment error
was recorded as the agent's failed attempt, or as an INVALID gate)."""
GATES_HOLD_LEASES = "gates-hold-gpu-leases"
"""Patch: a gate on a host with GPUs runs under a lease on them (before it, gates ran without one)."""
GATE_STARTUP_TIME = "gate-startup-time"
"""Patch, asked in the run's first activation: a gate's engine start-ups do not count against its timeout_s; the
step gets its `startup_timeout_s` on top (before it, a gate's whole run counted, so an alternating A/B of many vLLM
starts ended INVALID while its servers started)."""


class HostProblem(Exception):
    """A step the host could not run; the message is the question for the decider, with what to fix."""


class TicketSteps:
    def __init__(
        self,
        steps: Steps,
        trail: AuditTrail,
        ui: TicketUi,
        lessons: TicketLessons,
        hosts: dict[str, HostFacts],
        patches: PatchesAtStart,
    ) -> None:
        self.steps = steps
        self.trail = trail
        self.ui = ui
        self.lessons = lessons
        self.hosts = hosts
        self.patches = patches
        self.gate_startup = False
        """Whether the run recorded GATE_STARTUP_TIME (set by the workflow in its first activation)."""

    def _schedule_to_start(self, host: str) -> timedelta | None:
        """The host's schedule-to-start limit; None for a ticket filed without the registry's facts."""
        facts = self.hosts.get(host)
        return None if facts is None else timedelta(seconds=facts.schedule_to_start_s)

    def _raise_if_the_hosts(self, spec: TicketSpec, step: str, failed: StepFailed) -> None:
        """Raise HostProblem when the host, not the work, failed the step (histories before the rule go on as
        they did)."""
        if not failed.is_the_hosts or not self.patches.patched(HOST_PROBLEMS_ASK):
            return
        host = spec.host
        if failed.kind is StepFailure.UNSERVED:
            limit = self.hosts[host].schedule_to_start_s
            raise HostProblem(
                f"Ticket {spec.id}: host {host} is unavailable: no worker took its {step} from task queue "
                f"{host_queue(host)} within {limit:g}s. Run `daedalus worker --host {host}` on {host} (or "
                f"refile the ticket on another host), then answer retry; no attempt was spent."
            )
        raise HostProblem(
            f"Ticket {spec.id}: the environment of host {host} is broken, so its {step} could not run: "
            f"{failed.message} No attempt was spent; answer retry once it is fixed."
        )

    async def attempt(self, spec: TicketSpec, number: int, brief: str) -> tuple[AttemptSummary, str]:
        """Run the agent once; the attempt (committed, or why not) and the text of its audit event."""
        filing = workflow.info().first_execution_run_id
        lessons = await self.lessons.for_prompt(spec)
        result = await self.steps.on_host(
            RUN_ATTEMPT,
            AttemptInput(spec=spec, attempt=number, brief=brief, filing=filing, lessons=lessons),
            host=spec.host,
            timeout=ATTEMPT_TIMEOUT,
            schedule_to_start=self._schedule_to_start(spec.host),
            summary=f"attempt {number}: {spec.agent.name.value if spec.agent else 'agent'} on {spec.host}",
        )
        if isinstance(result, StepFailed):
            self._raise_if_the_hosts(spec, f"attempt {number}", result)
            detail = f"the attempt step failed on {spec.host}: {result.message}"
            failed = AttemptSummary(
                number=number, branch="", outcome=AttemptOutcome.AGENT_FAILED, detail=detail
            )
            return failed, f"attempt {number}: step failed on the host: {result.message}"
        await self.lessons.traps(spec, result)
        usage = {"cost_usd": result.usage.cost_usd, "cost_source": result.usage.cost_source}
        if result.exit_reason is not ExitReason.COMMITTED or result.commit is None:
            no_commit = result.exit_reason is ExitReason.NO_COMMIT
            outcome = AttemptOutcome.NO_COMMIT if no_commit else AttemptOutcome.AGENT_FAILED
            summary = AttemptSummary(
                number=number, branch=result.branch, outcome=outcome, detail=result.summary(), **usage
            )
            return summary, f"attempt {number}: agent produced no usable commit ({result.exit_reason.value})"
        summary = AttemptSummary(
            number=number,
            branch=result.branch,
            commit=result.commit,
            outcome=AttemptOutcome.COMMITTED,
            **usage,
        )
        return (
            summary,
            f"attempt {number}: {result.agent} committed {result.commit[:12]} ({result.diff_stat})",
        )

    async def build(
        self, spec: TicketSpec, summary: AttemptSummary, engine: EngineRef | None = None
    ) -> AttemptSummary | None:
        """Build the attempt's commit (without an agent: `engine` at its commit, checked out by the build); the
        attempt marked BUILD_FAILED when it did not build, else None."""
        if spec.build is None:
            raise BrokenInvariant(f"ticket {spec.id}: the workflow builds only tickets with a build command")
        number = summary.number
        build = await self.steps.on_host(
            RUN_BUILD,
            BuildInput(
                ticket_id=spec.id,
                attempt=number,
                command=spec.build.command,
                timeout_s=spec.build.timeout_s,
                engine=engine,
                host=spec.host,
            ),
            host=spec.host,
            timeout=timedelta(seconds=spec.build.timeout_s + 60),
            schedule_to_start=self._schedule_to_start(spec.host),
            summary=f"build attempt {number} on {spec.host}",
        )
        if isinstance(build, StepFailed):
            self._raise_if_the_hosts(spec, f"build of attempt {number}", build)
            build = BuildResult(
                ok=False, returncode=-1, log="", log_tail=f"build step failed: {build.message}"
            )
        if build.ok:
            await self.trail.record(
                AuditKind.BUILD, f"attempt {number}: build passed", detail={"log": build.log}, wait=False
            )
            return None
        text = f"attempt {number}: build failed (exit {build.returncode})"
        await self.trail.record(AuditKind.BUILD, text, detail={"log": build.log}, wait=False)
        detail = f"build exited {build.returncode}: {build.log_tail[-600:]}"
        return summary.changed(outcome=AttemptOutcome.BUILD_FAILED, detail=detail)

    async def measure(
        self, spec: TicketSpec, gate: GateSpec, attempt: int, commit: str, engine: EngineRef | None = None
    ) -> GateResult:
        """Measure a gate; INCONCLUSIVE and INVALID are rerun automatically before anyone is asked. Without an
        agent it measures `engine` (default: the spec's, at its base commit)."""
        if engine is None:
            engine = spec.engine if spec.agent is None else None
        for round_number in range(1, spec.approval.inconclusive_reruns + 2):
            self.ui.measuring(spec, gate.name, attempt)
            step = GateInput(
                ticket_id=spec.id,
                attempt=attempt,
                round=round_number,
                gate=gate,
                host=spec.host,
                commit=commit,
                engine=engine,
                startup_s=gate.startup_timeout_s if self.gate_startup else 0,
            )
            measured = await self._gate_step(spec, step)
            if isinstance(measured, StepFailed):
                self._raise_if_the_hosts(spec, f"gate {gate.name} of attempt {attempt}", measured)
            result = (
                rules.failed_step_result(gate, spec.host, commit, measured.message)
                if isinstance(measured, StepFailed)
                else measured
            )
            verdict = result.verdict.value
            await self.trail.record(
                AuditKind.GATE,
                f"attempt {attempt}: gate {gate.name} round {round_number}: {verdict} — {result.reason}",
                detail={"gate": gate.name, "verdict": verdict, "round": str(round_number)},
                gate_results=[result],
                attempt=attempt,
                wait=False,
            )
            if result.verdict in (Verdict.PASS, Verdict.FAIL):
                break
        return result

    async def _gate_step(self, spec: TicketSpec, step: GateInput) -> GateResult | StepFailed:
        """Run one round of a gate; on a host with GPUs, under a lease on all of them, recorded in the result."""
        facts = self.hosts.get(spec.host)
        timeout = timedelta(seconds=step.gate.timeout_s + step.startup_s + 60)
        schedule_to_start = self._schedule_to_start(spec.host)
        summary = gate_activity_summary(
            step.gate.name, step.gate.describe(), attempt=step.attempt, round=step.round
        )
        if facts is None or facts.gpus == 0 or not self.patches.patched(GATES_HOLD_LEASES):
            return await self.steps.on_host(
                RUN_GATE,
                step,
                host=spec.host,
                timeout=timeout,
                schedule_to_start=schedule_to_start,
                summary=summary,
            )
        run_id = workflow.info().first_execution_run_id
        request = LeaseRequest(
            lease_id=lease_id_for(
                ticket_workflow_id(spec.id),
                run_id[:8],
                f"attempt-{step.attempt}",
                step.gate.name,
                f"round-{step.round}",
            ),
            holder=f"ticket {spec.id} gate {step.gate.name}",
            purpose="ab" if step.gate.kind is GateKind.AB else "gate",
            gpus=list(range(facts.gpus)),
        )

        async def under_lease() -> GateResult | StepFailed:
            async with holding_lease(spec.host, request) as lease:
                leased = LeaseRecord(lease_id=lease.lease_id, host=spec.host, gpus=lease.gpus)
                measured = await self.steps.on_host(
                    RUN_GATE,
                    step.changed(lease=leased),
                    host=spec.host,
                    timeout=timeout,
                    schedule_to_start=schedule_to_start,
                    summary=summary,
                    interruptible=False,  # `run` below interrupts the whole of it, the lease's wait too
                )
            if isinstance(measured, StepFailed):
                return measured
            return measured.changed(lease=leased)

        try:
            result = await self.steps.run(under_lease())
        except ActivityError as refused:  # the lease keeper would not grant the GPUs
            self.steps.raise_if_interrupted()
            cause = refused.cause
            reason = cause.message if isinstance(cause, FailureError) else str(refused)
            raise HostProblem(
                f"Ticket {spec.id}: the GPUs of host {spec.host} could not be leased for gate "
                f"{step.gate.name} of attempt {step.attempt}: {reason}. No attempt was spent; answer retry "
                f"once they can be."
            ) from None
        self.steps.raise_if_interrupted()
        return result
