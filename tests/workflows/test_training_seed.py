"""train8 as the seed ran it, on the real dev server: progress and ETA, every complete checkpoint evaluated
confined as a gate is, and a checkpoint that clears the bar proposed to the deciders and, on approval, committed to
a serving preset in a real git repository by the host.

The first test runs the real PyTorch trainer (CPU build) and the real drafter evaluation in bubblewrap; the others
use the tests' trainer and its `--evaluate` mode (a score that grows with the step), to make the desk's harder
paths happen on time: a stop while a proposal waits, and an escalation that takes the desk from a proposal.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from sqlalchemy import Engine
from sqlmodel import Session, select
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from daedalus.decisions.schemas import Decision, DecisionKind, DecisionRequest
from daedalus.report import build_report, render_markdown
from daedalus.schemas.audit import AuditKind
from daedalus.schemas.gates import GateKind, GateSpec, Metric, Verdict
from daedalus.schemas.ticket import CancelRequest
from daedalus.schemas.training import (
    CheckpointPolicy,
    DeploymentOutcome,
    DeploymentPolicy,
    EvaluationPolicy,
    MemorySource,
    RestartPolicy,
    RunState,
    StopTraining,
    TrainingRunInput,
    TrainingRunSpec,
    TrainingRunStatus,
    WatchdogPolicy,
)
from daedalus.store.database import session_scope
from daedalus.store.tables import DecisionRow, VerdictRow
from daedalus.workflows.ticket import TicketWorkflow
from daedalus.workflows.training import TrainingRunWorkflow
from tests.workflows.test_training import (
    ROOT,
    TRAINER,
    audit_trail,
    make_spec,
    replay,
    trainers,
    until,
    within,
    workers,
)

PRESET = ROOT / "examples" / "training" / "serving-config" / "presets" / "drafter-lane.yaml"


def serving_repo(tmp: Path) -> Path:
    """The team's serving-config repository: one preset, committed."""
    repo = tmp / "serving-config"
    (repo / "presets").mkdir(parents=True)
    shutil.copy(PRESET, repo / "presets" / "drafter-lane.yaml")
    for args in (["init", "-q"], ["add", "presets"], ["commit", "-qm", "serving presets"]):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=ops", "-c", "user.email=ops@localhost", *args],
                       check=True, capture_output=True)  # fmt: skip
    return repo


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def deploy_policy(repo: Path) -> DeploymentPolicy:
    return DeploymentPolicy(repo=repo, preset="presets/drafter-lane.yaml", key="speculative.model")


async def pending_deployment(
    handle: WorkflowHandle[TrainingRunWorkflow, TrainingRunStatus],
    timeout_s: float = 120,
    also: Callable[[TrainingRunStatus], bool] = lambda status: True,
) -> DecisionRequest:
    status = await until(
        handle,
        lambda s: (
            s.pending_decision is not None and s.pending_decision.kind is DecisionKind.DEPLOYMENT and also(s)
        ),
        timeout_s=timeout_s,
    )
    assert status.pending_decision is not None
    return status.pending_decision


async def answer(
    handle: WorkflowHandle[TrainingRunWorkflow, TrainingRunStatus], request: DecisionRequest, option: str
) -> TrainingRunStatus:
    return await within(
        handle.execute_update(
            TrainingRunWorkflow.decide, Decision(request_id=request.id, option=option, decided_by="wayne")
        )
    )


@pytest.mark.timeout(900)
async def test_seed_train8_progress_evaluations_and_a_deployment_committed_on_approval(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    pytest.importorskip("torch")
    repo = serving_repo(tmp_path)
    name = f"r{uuid.uuid4().hex[:8]}"
    ckpt = tmp_path / "ckpt"
    spec = TrainingRunSpec.model_validate(
        {
            "name": name,
            "host": name,
            "command": [
                sys.executable,
                "-m",
                "daedalus.training.gpu_trainer",
                "--device",
                "cpu",
                "--d-model",
                "32",
                "--layers",
                "1",
                "--heads",
                "2",
                "--seq",
                "16",
                "--batch",
                "8",
                "--vocab",
                "64",
                "--lr",
                "3e-3",
                "--log-every",
                "10",
                "--min-step-s",
                "0.1",
            ],
            "cwd": tmp_path,
            "target_steps": 40,
            "progress_window_s": 20,
            "checkpoints": CheckpointPolicy(directory=ckpt, every_steps=10, keep=2),
            "watchdog": WatchdogPolicy(
                memory_source=MemorySource.PROCESS_TREE,
                budget_mib=4096,
                min_available_gib=1.0,
                sample_interval_s=0.5,
                report_interval_s=2,
            ),
            "evaluation": EvaluationPolicy(
                gate=GateSpec(
                    name="drafter-acceptance",
                    metric=Metric.ACCEPTANCE_LENGTH,
                    kind=GateKind.AB,
                    threshold=2.5,
                    command="python -m daedalus.training.drafter_eval --k 4 --rounds 5",
                    timeout_s=300,
                ),
                deploy=deploy_policy(repo),
                max_waiting=4,  # every checkpoint is evaluated, however slow this machine is today
            ),
            "approval": {"deciders": ["wayne"], "reminder_interval_s": 3600},
            "state_dir": tmp_path / "state",
            "artifact_dir": tmp_path / "artifacts",
        }
    )
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine):
        handle = await temporal_client.start_workflow(
            TrainingRunWorkflow.run, TrainingRunInput(spec=spec), id=spec.workflow_id, task_queue=task_queue
        )
        # Progress as the watchdog reads it from the trainer: steps toward the target, throughput, the ETA.
        running = await until(
            handle,
            lambda s: s.progress is not None and s.progress.eta_s is not None and s.progress.step < 40,
            timeout_s=180,
        )
        progress = running.progress
        assert progress is not None and progress.target_steps == 40 and progress.steps_per_s is not None
        assert progress.tokens_per_s == pytest.approx(progress.steps_per_s * 8 * 16, rel=0.01)
        assert running.wakeups is not None
        assert "PSI (host-wide)" in running.wakeups or running.wakeups.startswith("polling")
        # The first checkpoint that clears the bar is proposed; wayne approves it.
        first = await pending_deployment(handle, timeout_s=400)
        status = await handle.query(TrainingRunWorkflow.status)
        [proposed] = [
            e for e in status.evaluations if f"speculative.model := {e.checkpoint}" in first.evidence
        ]
        assert proposed.clears and proposed.name in first.question
        assert first.options == ["deploy", "skip"] and first.deciders == ["wayne"]
        assert first.id == f"{spec.workflow_id}-deployment-1"
        await answer(handle, first, "deploy")
        # A better checkpoint later (acceptance keeps rising) is proposed too; those wayne skips.
        asked = [first.id]
        deadline = asyncio.get_running_loop().time() + 600
        while (await handle.describe()).status is WorkflowExecutionStatus.RUNNING:
            assert asyncio.get_running_loop().time() < deadline, await handle.query(
                TrainingRunWorkflow.status
            )
            pending = (await handle.query(TrainingRunWorkflow.status)).pending_decision
            if pending is not None and pending.id not in asked:
                asked.append(pending.id)
                await answer(handle, pending, "skip")
            await asyncio.sleep(0.3)
        final = await within(handle.result(), 120)

    assert final.state is RunState.FINISHED and not trainers(spec)
    # Every complete checkpoint evaluated, in order; the first below the bar, the proposals above it.
    assert [Path(e.checkpoint).name for e in final.evaluations] == [
        f"ckpt-00000{n}" for n in (10, 20, 30, 40)
    ]
    assert [e.step for e in final.evaluations] == [10, 20, 30, 40]
    assert final.evaluations[0].verdict is Verdict.FAIL and final.evaluations[-1].verdict is Verdict.PASS
    assert all(e.baseline is not None and e.score is not None for e in final.evaluations)
    scores = [e.score for e in final.evaluations if e.score is not None]
    assert scores == sorted(scores)  # the drafter gets better as it trains
    deployed, *rest = final.deployments
    assert deployed.outcome is DeploymentOutcome.DEPLOYED and deployed.checkpoint == proposed.checkpoint
    assert all(d.outcome is DeploymentOutcome.SKIPPED for d in rest) and len(rest) == len(asked) - 1
    # The host's commit: the preset's drafter is the approved checkpoint, the commit names the decision.
    preset = yaml.safe_load((repo / "presets" / "drafter-lane.yaml").read_text())
    assert preset["speculative"]["model"] == deployed.checkpoint
    assert deployed.commit == git(repo, "log", "-1", "--format=%H", "--", "presets/drafter-lane.yaml").strip()
    message = git(repo, "log", "-1", "--format=%an%n%B", deployed.commit)
    assert message.startswith("daedalus\n") and f"Daedalus-Deployment: {first.id}" in message
    assert "approved by wayne" in message and deployed.previous == "none-deployed-yet"
    assert git(repo, "status", "--porcelain") == ""
    # The audit trail: one event per evaluation (each with its verdict in the store), the decision, the commit.
    trail = audit_trail(sqlite_engine, spec)
    kinds = [e.kind for e in trail]
    assert kinds.count(AuditKind.EVALUATION) == 4 and kinds[-1] == AuditKind.CLOSED
    deploy_events = [e for e in trail if e.kind == AuditKind.DEPLOYMENT]
    assert deploy_events[0].detail["commit"] == deployed.commit and deploy_events[0].actor == "wayne"
    assert (
        kinds.index(AuditKind.DECISION_REQUESTED)
        < kinds.index(AuditKind.DECIDED)
        < kinds.index(AuditKind.DEPLOYMENT)
    )
    evaluation_events = [e for e in trail if e.kind == AuditKind.EVALUATION]
    assert (
        evaluation_events[0].detail["verdict"] == "FAIL"
        and "trainer_progress" in evaluation_events[-1].detail
    )
    with Session(sqlite_engine) as session:
        verdicts = session.exec(select(VerdictRow).where(VerdictRow.ticket_id == spec.workflow_id)).all()
        asked_rows = session.exec(select(DecisionRow).where(DecisionRow.request_id == first.id)).all()
    assert [v.verdict for v in verdicts] == [e.verdict.value for e in final.evaluations]
    assert all(v.metric == "acceptance_length" and len(v.samples) == 5 for v in verdicts)
    assert [(r.option, r.decided_by) for r in asked_rows] == [("deploy", "wayne")]
    # The report, from the store: the run's progress, its evaluations and its deployment.
    with session_scope(sqlite_engine) as session:
        text = render_markdown(build_report(session=session, since=trail[0].at))
    assert f"**{name}** checkpoints evaluated:" in text and "ckpt-0000010 (step 10): FAIL" in text
    assert f"**{name}** deployments:" in text and deployed.commit[:12] in text
    assert f"**{name}** progress: step 40 / 40 (100%)" in text
    await replay(handle, "training-evaluation-deployment.json")


def scored_spec(tmp: Path, repo: Path | None, **overrides: object) -> TrainingRunSpec:
    """The tests' trainer, with its own `--evaluate` as the evaluation: step 10 on clears a ratio of 1.9."""
    evaluation = EvaluationPolicy(
        gate=GateSpec(
            name="score",
            metric=Metric.ACCEPTANCE_LENGTH,
            kind=GateKind.AB,
            threshold=1.9,
            command=f"{sys.executable} {TRAINER} --evaluate",
            timeout_s=120,
        ),
        deploy=deploy_policy(repo) if repo is not None else None,
    )
    return make_spec(
        tmp,
        "--step-s",
        "0.05",
        evaluation=evaluation,
        approval={"deciders": ["wayne"], "reminder_interval_s": 3600},
        **overrides,
    )


async def test_seed_train8_a_stop_withdraws_a_waiting_proposal_whose_checkpoint_was_kept(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    repo = serving_repo(tmp_path)
    spec = scored_spec(tmp_path, repo)
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine):
        handle = await temporal_client.start_workflow(
            TrainingRunWorkflow.run, TrainingRunInput(spec=spec), id=spec.workflow_id, task_queue=task_queue
        )
        request = await pending_deployment(handle)
        status = await handle.query(TrainingRunWorkflow.status)
        evaluated = [e for e in status.evaluations if e.clears]
        proposed = evaluated[0]
        assert proposed.step is not None and proposed.step >= 10
        assert all(e.step is not None and e.step < 10 for e in status.evaluations if not e.clears)
        # The trainer goes on writing a checkpoint every 0.25 s (keep 2), but the one waiting for its decision
        # stays; what waits for an evaluation never grows past max_waiting besides the one being evaluated.
        await until(handle, lambda s: s.progress is not None and s.progress.step >= (proposed.step or 0) + 20)
        status = await handle.query(TrainingRunWorkflow.status)
        assert (Path(proposed.checkpoint) / "COMPLETE").is_file()
        assert len(status.waiting_evaluation) <= 3
        steps = [e.step for e in status.evaluations]
        assert steps == sorted(steps)
        await within(handle.execute_update(TrainingRunWorkflow.stop, StopTraining(requested_by="wayne")))
        final = await within(handle.result())
    assert final.state is RunState.STOPPED and final.pending_decision is None and not trainers(spec)
    assert [d.outcome for d in final.deployments] == [DeploymentOutcome.WITHDRAWN]
    assert final.deployments[0].checkpoint == proposed.checkpoint
    assert git(repo, "log", "--format=%s") == "serving presets\n"  # nothing was committed
    trail = audit_trail(sqlite_engine, spec)
    assert [e.detail["outcome"] for e in trail if e.kind == AuditKind.DEPLOYMENT] == ["withdrawn"]
    with Session(sqlite_engine) as session:
        row = session.get(DecisionRow, request.id)
    assert row is not None and row.option is None and row.note.startswith("withdrawn")


async def test_seed_train8_an_escalation_takes_the_desk_and_the_proposal_is_asked_again_after_it(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    """A leaking trainer dies three times while its proposal waits: the escalation withdraws the proposal,
    is answered, and the same checkpoint is proposed again; approved, it is committed."""
    repo = serving_repo(tmp_path)
    spec = scored_spec(
        tmp_path,
        repo,
        restart=RestartPolicy(restart_delay_s=0.2),
    ).changed(command=[sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp_path / "ckpt"),
                       "--step-s", "0.05", "--mib-per-step", "1.5"])  # fmt: skip
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine):
        handle = await temporal_client.start_workflow(
            TrainingRunWorkflow.run, TrainingRunInput(spec=spec), id=spec.workflow_id, task_queue=task_queue
        )
        first = await pending_deployment(handle)
        escalated = await until(
            handle,
            lambda s: s.pending_decision is not None and s.pending_decision.kind is DecisionKind.ESCALATION,
            timeout_s=120,
        )
        assert escalated.state is RunState.AWAITING_DECISION and len(escalated.deaths) == 3
        assert [d.outcome for d in escalated.deployments] == [DeploymentOutcome.WITHDRAWN]
        assert escalated.pending_decision is not None
        await answer(handle, escalated.pending_decision, "restart")
        again = await pending_deployment(
            handle, also=lambda s: s.pending_decision is not None and s.pending_decision.id != first.id
        )
        assert again.question == first.question and again.id == f"{spec.workflow_id}-deployment-3"
        await answer(handle, again, "deploy")
        status = await until(handle, lambda s: len(s.deployments) == 2)
        await within(handle.execute_update(TrainingRunWorkflow.stop, StopTraining(requested_by="wayne")))
        final = await within(handle.result())
        # The hunting ticket outlives the run (ABANDON): cancel it, so the test leaves nothing open.
        hunt = temporal_client.get_workflow_handle_for(TicketWorkflow.run, f"ticket-hunt-{spec.name}-1")
        await within(
            hunt.execute_update(TicketWorkflow.cancel, CancelRequest(requested_by="wayne", reason="over"))
        )
    deployed = status.deployments[-1]
    assert deployed.outcome is DeploymentOutcome.DEPLOYED and deployed.request_id == again.id
    preset = yaml.safe_load((repo / "presets" / "drafter-lane.yaml").read_text())
    assert preset["speculative"]["model"] == deployed.checkpoint
    assert final.state is RunState.STOPPED and not trainers(spec)
    trail = audit_trail(sqlite_engine, spec)
    kinds = [e.kind for e in trail]
    withdrawn = kinds.index(AuditKind.DEPLOYMENT)
    assert kinds.index(AuditKind.HUNT) > withdrawn  # the proposal gave way before the escalation was asked
    assert (
        trail[withdrawn].detail["outcome"] == "withdrawn" and trail[withdrawn].detail["request"] == first.id
    )
    with Session(sqlite_engine) as session:
        row = session.get(DecisionRow, first.id)
    # Withdrawn in the store while the run lived on: no longer listed as waiting for wayne.
    assert row is not None and row.decided_at is not None and row.note.startswith("withdrawn: ")
    await replay(handle, "training-escalation-over-a-proposal.json")


async def test_seed_train8_asks_nothing_without_a_deploy_policy_and_a_crashing_evaluation_is_invalid(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    spec = scored_spec(tmp_path, None, target_steps=20)
    broken = (
        spec.evaluation.changed(gate=spec.evaluation.gate.changed(command="exit 7"))
        if spec.evaluation
        else None
    )
    spec = spec.changed(evaluation=broken, command=[*spec.command, "--steps", "20"])
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine):
        handle = await temporal_client.start_workflow(
            TrainingRunWorkflow.run, TrainingRunInput(spec=spec), id=spec.workflow_id, task_queue=task_queue
        )
        final = await within(handle.result(), 120)
    assert final.state is RunState.FINISHED and final.deployments == [] and final.pending_decision is None
    assert final.evaluations and all(e.verdict is Verdict.INVALID for e in final.evaluations)
    assert "exited 7" in final.evaluations[0].reason
    assert (
        Path(final.evaluations[-1].checkpoint).name == "ckpt-0000020"
    )  # the last one, after the trainer ended
    trail = audit_trail(sqlite_engine, spec)
    assert AuditKind.DECISION_REQUESTED not in [e.kind for e in trail]
