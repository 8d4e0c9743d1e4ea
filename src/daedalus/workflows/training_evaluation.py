"""A training run's checkpoint evaluations and deployments (patch `EVALUATION_PATCH`), composed into the run.

A run with an `evaluation` measures every complete checkpoint the watchdog reports, on its host and confined as
a gate is (`evaluate_checkpoint`), one after another while the supervision goes on; each verdict is an audit
event that carries the verdict itself. A checkpoint that clears the bar and beats every one proposed before is
proposed for its serving preset: a deployment decision through the run's decision desk, asked while the trainer
goes on, and on approval a commit the host makes in the serving-config repository (`deploy_checkpoint`),
recorded with its sha. The desk holds one request at a time: an escalation withdraws a pending deployment
request and the proposal is asked again once the escalation is answered. A run that finishes evaluates its last
checkpoints and waits for a pending deployment decision before it closes.

Only the run's one coroutine issues commands: it waits for its segment, an evaluation's end or a deployment's
answer, whichever comes first, and acts on it (`turn`). A second coroutine issuing activities and timers beside
it would order its commands by when local activities (the audit writes) resolve, which a replay may group
differently, and fail the replay. What to queue, propose and record is decided by workflows/training_rules.py.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Protocol

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import DEPLOY_CHECKPOINT, EVALUATE_CHECKPOINT
    from daedalus.decisions.desk import DecisionDesk, Waiting
    from daedalus.decisions.schemas import DecisionKind, DeploymentOption
    from daedalus.ids import host_queue
    from daedalus.schemas.audit import AuditKind
    from daedalus.schemas.gates import LeaseRecord
    from daedalus.schemas.training import (
        CheckpointEvaluated,
        CheckpointEvaluation,
        Deployment,
        DeploymentInput,
        DeploymentOutcome,
        DeploymentPolicy,
        EvaluationInput,
        EvaluationPolicy,
        RunState,
        SegmentReport,
        TrainingCarry,
        TrainingRunSpec,
    )
    from daedalus.workflows import training_rules as rules
    from daedalus.workflows.steps import StepFailed, Steps, failed_step
    from daedalus.workflows.trail import AuditTrail

EVALUATION_PATCH = "training-checkpoint-evaluation"
"""Runs report their progress, evaluate their checkpoints and propose the ones that clear the bar for a serving
preset (`spec.evaluation`). Asked in the run's first activation (patches.py says why there); histories recorded
before it (every stored training-*.json but the two of tests/workflows/test_training_seed.py) have no evaluation
and replay without it."""
DEPLOY_TIMEOUT = timedelta(seconds=120)
EVALUATION_ALLOWANCE_S = 120
"""Beyond the evaluation gate's own timeout: the sandbox's start, the verdict."""


class EvaluatedRun(Protocol):
    """What of TrainingRunWorkflow its evaluations use: the spec, the carry, the trail, the desk, the steps."""

    spec: TrainingRunSpec
    c: TrainingCarry
    trail: AuditTrail
    desk: DecisionDesk
    steps: Steps
    lease: LeaseRecord | None

    def notifies(self) -> bool: ...


class CheckpointEvaluations:
    def __init__(self, run: EvaluatedRun) -> None:
        self.run = run
        self.on = False
        """EVALUATION_PATCH is on and the run has an evaluation: checkpoints are evaluated and proposed."""
        self.run_over = False
        self.answered = False
        """A deployment request was answered: the run's loop acts on it between its steps."""
        self._evaluation: workflow.ActivityHandle[CheckpointEvaluated] | None = None
        self._evaluating_now: str | None = None

    def ask_patch(self) -> None:
        """Whether EVALUATION_PATCH is on, asked in `run`'s first activation (a patch question, not a decision);
        decided by the spec first: a run without an evaluation records no marker for it."""
        self.on = self.run.spec.evaluation is not None and workflow.patched(EVALUATION_PATCH)

    @property
    def policy(self) -> EvaluationPolicy:
        evaluation = self.run.spec.evaluation
        if evaluation is None:
            raise RuntimeError("the run evaluates no checkpoints")  # never: only a run with one evaluates
        return evaluation

    @property
    def deploy_policy(self) -> DeploymentPolicy:
        deploy = self.policy.deploy
        if deploy is None:
            raise RuntimeError("the run deploys no checkpoints")  # never: only a deploying run proposes
        return deploy

    def _set(self, **changes: object) -> None:
        self.run.c = self.run.c.changed(**changes)

    def queue(self, checkpoints: list[str]) -> None:
        self.run.c = rules.queued(self.run.c, checkpoints, self._evaluating_now, self.policy.max_waiting)

    def needed(self) -> list[str]:
        """Checkpoints the watchdog must not prune (none when the run evaluates none)."""
        return rules.needed(self.run.c) if self.on else []

    def over(self) -> bool:
        """The run will take its evaluations no further: a stop was asked, or it ended other than finished."""
        c = self.run.c
        return c.stop is not None or (self.run_over and c.state is not RunState.FINISHED)

    def _turn_due(self) -> bool:
        """Something for `turn` to act on: an evaluation ended, or a deployment was answered."""
        return (self._evaluation is not None and self._evaluation.done()) or self.answered

    async def beside(self, segment: workflow.ActivityHandle[SegmentReport]) -> None:
        """While the segment runs, act on evaluations and deployment answers as they come."""
        await self.turn()
        while True:
            await workflow.wait_condition(lambda: segment.done() or self._turn_due())
            if segment.done():
                return
            await self.turn()

    async def turn(self) -> None:
        """Record an evaluation that ended, act on a deployment's answer, start the next evaluation, and propose
        the best checkpoint that cleared the bar when the desk is free."""
        evaluation, checkpoint = self._evaluation, self._evaluating_now
        if evaluation is not None and evaluation.done() and checkpoint is not None:
            self._evaluation, self._evaluating_now = None, None
            await self._record_evaluation(checkpoint, self._evaluated(evaluation))
        if self.answered:
            await self.take_answer()
        if self.over():
            return
        c = self.run.c
        if self._evaluation is None and c.waiting:
            self._start(c.waiting[0])
        if (
            (c.proposing is not None or c.candidate is not None)
            and self.run.desk.pending is None
            and c.state is not RunState.AWAITING_DECISION
        ):
            await self._propose()

    async def finish(self) -> None:
        """After the run: a finished run evaluates what is left and waits for its proposal's answer; a stopped
        one withdraws its proposal and drops its evaluation."""
        self.run_over = True
        while not self.over():
            if self._evaluation is not None:
                await workflow.wait_condition(lambda: self._turn_due() or self.over())
                if self.over():
                    break
            await self.turn()
            if self._evaluation is not None:
                continue
            pending = self.run.desk.pending
            if pending is not None and pending.kind is DecisionKind.DEPLOYMENT:
                # Nothing else left to do: wait for the answer, reminding as a ticket's decision is reminded.
                seconds = self.run.spec.approval.reminder_interval_s
                reminder = timedelta(seconds=seconds) if self.run.notifies() else None
                await self.take_answer(Waiting(reminder=reminder, interrupted=self.over))
                continue
            c = self.run.c
            if not c.waiting and c.candidate is None and c.proposing is None:
                return
        if self._evaluation is not None:
            self._evaluation.cancel()
        self._set(waiting=[])
        await self.withdraw("the run ended before a decision")

    def _start(self, checkpoint: str) -> None:
        spec, gate = self.run.spec, self.policy.gate
        self._evaluating_now = checkpoint
        self._evaluation = EVALUATE_CHECKPOINT.start(
            EvaluationInput(
                spec=spec,
                checkpoint=checkpoint,
                filing=workflow.info().first_execution_run_id,
                lease=self.run.lease,
            ),
            task_queue=host_queue(spec.host),
            start_to_close_timeout=timedelta(seconds=gate.timeout_s + EVALUATION_ALLOWANCE_S),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=2)),
            summary=f"evaluate {checkpoint.rsplit('/', 1)[-1]}: {gate.describe()}",
        )

    def _evaluated(self, evaluation: workflow.ActivityHandle[CheckpointEvaluated]) -> CheckpointEvaluated:
        """The evaluation's answer; one that failed after its retries is an INVALID verdict saying why."""
        try:
            return evaluation.result()
        except (ActivityError, asyncio.CancelledError) as error:
            reason = (
                f"the evaluation step failed: {failed_step(error).message}"
                if isinstance(error, ActivityError)
                else "the evaluation step was cancelled"
            )
            return rules.failed_evaluation(self.policy.gate, self.run.spec.host, reason)

    async def _record_evaluation(self, checkpoint: str, outcome: CheckpointEvaluated) -> None:
        policy, result = self.policy, outcome.result
        evaluated = rules.evaluation_of(checkpoint, outcome, self.run.c.skipped, workflow.now())
        self.run.c = rules.with_evaluation(
            self.run.c, evaluated, policy.deploy is not None, policy.gate.metric
        )
        report = self.run.c.last_report
        await self.run.trail.record(
            AuditKind.EVALUATION,
            f"evaluated {evaluated.summary()}" + ("" if evaluated.clears else f": {result.reason}"),
            detail=rules.evaluation_detail(evaluated, result, report.progress if report else None),
            gate_results=[result],
        )

    async def _propose(self) -> None:
        """Ask the deciders about the best checkpoint that cleared the bar; the run goes on meanwhile."""
        deploy = self.deploy_policy
        if self.run.c.proposing is None:
            self._set(proposing=self.run.c.candidate, candidate=None)
        proposing = self.run.c.proposing
        if proposing is None:
            return  # never: `turn` proposes only with a candidate or a proposal
        question, evidence = rules.proposal(self.run.spec, deploy, proposing)
        self.answered = False
        await self.run.desk.request(
            DecisionKind.DEPLOYMENT, question, DeploymentOption, evidence, ticket_id=self.run.spec.workflow_id
        )

    async def take_answer(self, waiting: Waiting | None = None) -> None:
        """Record the deployment's answer (the desk has it) and act on it: skip, or the host's commit."""
        self.answered = False
        answer = await self.run.desk.wait(
            DeploymentOption, waiting or Waiting(reminder=None, interrupted=self.over)
        )
        proposing = self.run.c.proposing
        if answer is None or proposing is None:
            return
        decision = answer.decision
        if answer.option is DeploymentOption.SKIP:
            await self._record(
                proposing,
                DeploymentOutcome.SKIPPED,
                f"{answer.by} chose not to deploy it",
                decision.decided_by,
                request_id=decision.request_id,
            )
        else:
            await self._deploy(proposing, decision.request_id, decision.decided_by)
        best = self.run.c.proposed_best
        if proposing.score is not None and rules.better(self.policy.gate.metric, proposing.score, best):
            best = proposing.score
        self._set(proposing=None, proposed_best=best)

    async def _deploy(self, proposing: CheckpointEvaluation, request_id: str, decided_by: str) -> None:
        deploy = self.deploy_policy
        done = await self.run.steps.on_host(
            DEPLOY_CHECKPOINT,
            DeploymentInput(
                run=self.run.spec.name,
                policy=deploy,
                checkpoint=proposing.checkpoint,
                step=proposing.step,
                request_id=request_id,
                decided_by=decided_by,
                evaluation=proposing.summary(),
            ),
            host=deploy.host or self.run.spec.host,
            timeout=DEPLOY_TIMEOUT,
            heartbeat=None,
            interruptible=False,
            summary=f"deploy {proposing.name} to {deploy.preset}",
        )
        if isinstance(done, StepFailed):
            why = f"approved by {decided_by}, but the commit failed: {done.message}"
            await self._record(proposing, DeploymentOutcome.FAILED, why, decided_by, request_id=request_id)
            return
        await self._record(
            proposing,
            DeploymentOutcome.DEPLOYED,
            f"{deploy.preset} {deploy.key}: {done.previous!r} -> {done.value!r}, commit {done.commit[:12]}"
            + (" (made by an earlier try)" if done.already else ""),
            decided_by,
            request_id=request_id,
            commit=done.commit,
            value=done.value,
            previous=done.previous,
        )

    async def withdraw(self, why: str, *, keep: bool = False) -> None:
        """Withdraw the pending deployment request (the store marks it so); `keep`: propose it again later."""
        pending = self.run.desk.pending
        request = pending.id if pending is not None and pending.kind is DecisionKind.DEPLOYMENT else None
        if request is not None:
            self.run.desk.withdraw()
        proposing = self.run.c.proposing
        if proposing is None or (keep and request is None):
            return
        if not keep:
            self._set(proposing=None)
        await self._record(proposing, DeploymentOutcome.WITHDRAWN, why, withdrawn=request)

    async def _record(
        self,
        evaluated: CheckpointEvaluation,
        outcome: DeploymentOutcome,
        summary: str,
        decided_by: str | None = None,
        *,
        request_id: str | None = None,
        commit: str | None = None,
        value: str | None = None,
        previous: str | None = None,
        withdrawn: str | None = None,
    ) -> None:
        deploy = self.deploy_policy
        deployment = Deployment(
            checkpoint=evaluated.checkpoint,
            step=evaluated.step,
            score=evaluated.score,
            request_id=request_id or withdrawn,
            outcome=outcome,
            decided_by=decided_by.split(":")[0] if decided_by else None,
            commit=commit,
            repo=str(deploy.repo),
            preset=deploy.preset,
            key=deploy.key,
            value=value,
            previous=previous,
            at=workflow.now(),
            summary=summary,
        )
        self._set(deployments=[*self.run.c.deployments, deployment][-rules.EVALUATIONS_KEPT :])
        await self.run.trail.record(
            AuditKind.DEPLOYMENT,
            f"{evaluated.name} {outcome.value}: {summary}",
            actor=deployment.decided_by or "daedalus",
            detail=rules.deployment_detail(deployment, withdrawn),
        )
