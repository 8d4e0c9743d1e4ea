"""A ticket's host steps: the agent's attempt, the build and the gates, each run on the ticket's host.

Each returns what the ticket needs to decide (an attempt summary, a gate result); a step that failed on the
host after its retries becomes such a result too (AGENT_FAILED, a failed build, an INVALID gate), never a
crash of the ticket. Build and gate events are written here; the attempt's event is the workflow's, because
its projection counts the attempt.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import RUN_ATTEMPT, RUN_BUILD, RUN_GATE
    from daedalus.schemas.agents import ExitReason
    from daedalus.schemas.audit import AuditKind
    from daedalus.schemas.gates import GateResult, GateSpec, Verdict
    from daedalus.schemas.steps import AttemptInput, BuildInput, BuildResult, GateInput
    from daedalus.schemas.ticket import AttemptOutcome, AttemptSummary, TicketSpec
    from daedalus.schemas.ui import gate_activity_summary
    from daedalus.workflows import ticket_rules as rules
    from daedalus.workflows.steps import StepFailed, Steps
    from daedalus.workflows.ticket_lessons import TicketLessons
    from daedalus.workflows.ticket_ui import TicketUi
    from daedalus.workflows.trail import AuditTrail

ATTEMPT_TIMEOUT = timedelta(hours=6)


class TicketSteps:
    def __init__(self, steps: Steps, trail: AuditTrail, ui: TicketUi, lessons: TicketLessons) -> None:
        self.steps = steps
        self.trail = trail
        self.ui = ui
        self.lessons = lessons

    async def attempt(self, spec: TicketSpec, number: int, brief: str) -> tuple[AttemptSummary, str]:
        """Run the agent once; the attempt (committed, or why not) and the text of its audit event."""
        filing = workflow.info().first_execution_run_id
        lessons = await self.lessons.for_prompt(spec)
        result = await self.steps.on_host(
            RUN_ATTEMPT,
            AttemptInput(spec=spec, attempt=number, brief=brief, filing=filing, lessons=lessons),
            host=spec.host,
            timeout=ATTEMPT_TIMEOUT,
            summary=f"attempt {number}: {spec.agent.name.value if spec.agent else 'agent'} on {spec.host}",
        )
        if isinstance(result, StepFailed):
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

    async def build(self, spec: TicketSpec, summary: AttemptSummary) -> AttemptSummary | None:
        """Build the attempt's commit; the attempt marked BUILD_FAILED when it did not build, else None."""
        assert spec.build is not None  # the workflow builds only tickets with a build command
        number = summary.number
        build = await self.steps.on_host(
            RUN_BUILD,
            BuildInput(
                ticket_id=spec.id, attempt=number, command=spec.build.command, timeout_s=spec.build.timeout_s
            ),
            host=spec.host,
            timeout=timedelta(seconds=spec.build.timeout_s + 60),
            summary=f"build attempt {number} on {spec.host}",
        )
        if isinstance(build, StepFailed):
            build = BuildResult(
                ok=False, returncode=-1, log="", log_tail=f"build step failed: {build.message}"
            )
        if build.ok:
            await self.trail.record(
                AuditKind.BUILD, f"attempt {number}: build passed", detail={"log": build.log}
            )
            return None
        text = f"attempt {number}: build failed (exit {build.returncode})"
        await self.trail.record(AuditKind.BUILD, text, detail={"log": build.log})
        detail = f"build exited {build.returncode}: {build.log_tail[-600:]}"
        return summary.model_copy(update={"outcome": AttemptOutcome.BUILD_FAILED, "detail": detail})

    async def measure(self, spec: TicketSpec, gate: GateSpec, attempt: int, commit: str) -> GateResult:
        """Measure a gate; INCONCLUSIVE and INVALID are rerun automatically before anyone is asked."""
        engine = spec.engine if spec.agent is None else None
        for round_number in range(1, spec.approval.inconclusive_reruns + 2):
            self.ui.measuring(spec, gate.name, attempt)
            measured = await self.steps.on_host(
                RUN_GATE,
                GateInput(
                    ticket_id=spec.id,
                    attempt=attempt,
                    round=round_number,
                    gate=gate,
                    host=spec.host,
                    commit=commit,
                    engine=engine,
                ),
                host=spec.host,
                timeout=timedelta(seconds=gate.timeout_s + 60),
                summary=gate_activity_summary(
                    gate.name, gate.describe(), attempt=attempt, round=round_number
                ),
            )
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
            )
            if result.verdict in (Verdict.PASS, Verdict.FAIL):
                break
        return result
