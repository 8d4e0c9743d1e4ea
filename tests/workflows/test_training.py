"""TrainingRunWorkflow on the real dev server, with a real trainer and (in one test) a host worker we SIGKILL.

The control worker runs the real TicketWorkflow (the hunting ticket) and the real audit activity on a SQLite
store, so each test also reads the run's audit trail back from the store.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError
from temporalio.worker import Replayer, Worker

from daedalus.activities.training import TrainingActivities
from daedalus.decisions.schemas import TrainingRunSubject
from daedalus.payloads import DATA_CONVERTER
from daedalus.schemas import search_attributes as sa
from daedalus.schemas.audit import AuditKind
from daedalus.schemas.ticket import (
    AgentName,
    ApprovalPolicy,
    CancelRequest,
    Decision,
    DecisionKind,
    EngineRef,
    RepoKind,
    TicketKind,
    TicketStatus,
)
from daedalus.schemas.training import (
    CheckpointPolicy,
    DeathClass,
    HuntPolicy,
    MemorySource,
    RestartPolicy,
    RunState,
    StopTraining,
    TrainingRunInput,
    TrainingRunSpec,
    TrainingRunStatus,
    WatchdogPolicy,
)
from daedalus.schemas.ui import start_summary
from daedalus.slack.settings import SlackSettings
from daedalus.store.queries import audit_events
from daedalus.store.tables import AuditEventRow, DecisionRow, TicketRow
from daedalus.worker import WorkerConfig, control_worker
from daedalus.workflows.ticket import TicketWorkflow
from daedalus.workflows.training import TrainingRunWorkflow
from tests.replay_split import replay_split_too, split_tasks_after_local_activities
from tests.slack.fake_slack import FakeSlack, running_fake_slack
from tests.slack.test_notify import settings_for
from tests.support import TEST_AUDIT_KEY, TEST_STEPS, status_is, wait_for

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "tests" / "fixtures" / "trainer.py"
HISTORIES = ROOT / "tests" / "histories"
WORKFLOWS = [TrainingRunWorkflow, TicketWorkflow]


def make_spec(tmp: Path, *trainer_args: str, **overrides: object) -> TrainingRunSpec:
    name = f"r{uuid.uuid4().hex[:8]}"
    watchdog = WatchdogPolicy(
        memory_source=MemorySource.PROCESS_TREE,
        budget_mib=400,
        min_available_gib=250 / 1024,  # stop once the trainer's tree uses 150 MiB
        sample_interval_s=0.1,
        slope_window_s=30,
        min_fit_span_s=2,
        checkpoint_grace_s=5,
        term_grace_s=3,
        report_interval_s=1.0,
    )
    fields: dict[str, object] = {
        "name": name,
        "host": name,  # a host queue of its own per test
        "command": [sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp / "ckpt"), *trainer_args],
        "cwd": tmp,
        "checkpoints": CheckpointPolicy(directory=tmp / "ckpt", every_steps=5, keep=2),
        "watchdog": watchdog,
        "restart": RestartPolicy(restart_delay_s=0.2),
        "state_dir": tmp / "state",
        "artifact_dir": tmp / "artifacts",
        "hunt": HuntPolicy(engine=EngineRef(name="trainer", kind=RepoKind.REPO, repo=str(ROOT))),
        **overrides,
    }
    return TrainingRunSpec.model_validate(fields)


@asynccontextmanager
async def workers(
    client: Client,
    task_queue: str,
    spec: TrainingRunSpec,
    tmp: Path,
    engine: Engine,
    host_worker: bool = True,
    slack: SlackSettings | None = None,
) -> AsyncIterator[None]:
    """The control queue as production assembles it (both workflows, the audit store on `engine`, Slack when
    given) and, unless told otherwise, the run's host queue."""
    acts = TrainingActivities(tmp / "artifacts", steps=TEST_STEPS)
    config = WorkerConfig(
        steps=TEST_STEPS,
        audit_key=TEST_AUDIT_KEY,
        slack=slack,
        control_queue=task_queue,
        hosts=[],
        workspace_root=tmp / "ws",
        artifacts=tmp / "artifacts",
        fail_workflows_on_bugs=True,  # a workflow bug fails the run at once
    )
    async with control_worker(client, config, engine):
        if host_worker:
            async with Worker(
                client,
                task_queue=f"host-{spec.host}",
                activities=[
                    acts.supervise_training,
                    acts.training_host_report,
                    acts.evaluate_checkpoint,
                    acts.deploy_checkpoint,
                ],
            ):
                yield
        else:
            yield


async def until(
    handle: WorkflowHandle[TrainingRunWorkflow, TrainingRunStatus],
    ok: Callable[[TrainingRunStatus], bool],
    timeout_s: float = 60,
) -> TrainingRunStatus:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        status = await handle.query(TrainingRunWorkflow.status)
        if ok(status):
            return status
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out; last status: {status.model_dump_json(indent=1)}")
        await asyncio.sleep(0.2)


def trainers(spec: TrainingRunSpec) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if str(TRAINER) in cmd and str(spec.checkpoints.directory) in cmd and "-m" not in cmd:
            found.append(proc)
    return found


T = TypeVar("T")


async def within(call: Awaitable[T], timeout_s: float = 60) -> T:
    """Await an update or a result with a deadline: a stuck worker fails the test in a minute, not at 300 s."""
    return await asyncio.wait_for(call, timeout_s)


async def expect_rejected(call: Awaitable[object], fragment: str) -> None:
    with pytest.raises(WorkflowUpdateFailedError) as caught:
        await within(call)
    assert fragment in str(caught.value.cause)


async def replay(
    handle: WorkflowHandle[TrainingRunWorkflow, TrainingRunStatus],
    record_as: str | None,
    *,
    split: bool = True,
) -> None:
    """Replay the run's history with the current code and, with `split`, also as a query answered while a local
    activity's result was pending could have split its tasks (tests/replay_split.py)."""
    history = await handle.fetch_history()
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)
    await (replay_split_too(replayer, history) if split else replayer.replay_workflow(history))
    if record_as and os.environ.get("DAEDALUS_RECORD_HISTORIES"):
        (HISTORIES / record_as).write_text(history.to_json())


def audit_trail(engine: Engine, spec: TrainingRunSpec) -> list[AuditEventRow]:
    """The run's audit events from the store, in the order they were written."""
    with Session(engine) as session:
        events = list(audit_events(session=session, ticket_id=spec.workflow_id))
    assert {(e.workflow_id, e.run_id) for e in events} == {(spec.workflow_id, events[0].run_id)}
    return sorted(events, key=lambda e: e.seq)


async def test_third_death_escalates_once_opens_one_hunting_ticket_and_reaches_slack(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    hunt = HuntPolicy(engine=EngineRef(name="trainer", kind=RepoKind.VLLM, repo=str(ROOT)))
    approval = ApprovalPolicy(deciders=["wayne"], reminder_interval_s=1)
    spec = make_spec(
        tmp_path,
        "--mib-per-step",
        "8",
        "--step-s",
        "0.05",
        "--half-written-every",
        "3",
        hunt=hunt,
        approval=approval,
    )
    with running_fake_slack() as slack:
        await escalate_and_stop(temporal_client, task_queue, tmp_path, sqlite_engine, spec, slack)
    # The escalation reached Slack with its buttons, and each reminder went to its thread, once each.
    run_posts = [p for p in slack.posts if spec.workflow_id in str(p)]
    first, *reminders = run_posts
    assert f"{spec.workflow_id}-escalation-1" in str(first) and "restart" in str(first)
    assert reminders and all(post.get("thread_ts") == first["ts"] for post in reminders)
    trail = audit_trail(sqlite_engine, spec)
    assert len(reminders) == sum(1 for e in trail if e.kind == AuditKind.DECISION_REMINDER)


async def escalate_and_stop(
    temporal_client: Client,
    task_queue: str,
    tmp_path: Path,
    sqlite_engine: Engine,
    spec: TrainingRunSpec,
    slack: FakeSlack,
) -> None:
    hunt = spec.hunt
    slack_settings = settings_for(slack)
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine, slack=slack_settings):
        handle = await temporal_client.start_workflow(
            TrainingRunWorkflow.run, TrainingRunInput(spec=spec), id=spec.workflow_id, task_queue=task_queue
        )
        first = await until(handle, lambda s: len(s.deaths) >= 1)
        # The same death reported again (an operator, a second monitor) changes nothing.
        await handle.signal(TrainingRunWorkflow.report_death, first.deaths[0])
        await handle.signal(TrainingRunWorkflow.report_death, first.deaths[0])
        status = await until(handle, lambda s: s.state is RunState.AWAITING_DECISION)

    # A worker restart while the decision is pending: the replay must not open a second ticket.
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine, slack=slack_settings):
        await handle.signal(TrainingRunWorkflow.report_death, status.deaths[-1])
        status = await until(handle, lambda s: s.state is RunState.AWAITING_DECISION)
        assert [d.incarnation for d in status.deaths] == [1, 2, 3]
        assert all(d.death_class is DeathClass.WATCHDOG_STOP for d in status.deaths)
        assert status.death_counter == 3
        ticket_id = f"hunt-{spec.name}-1"
        assert status.hunting_tickets == [ticket_id]
        # Incarnations 2 and 3 resumed from the checkpoint the previous one wrote on our stop signal.
        [log2_path] = (tmp_path / "state" / spec.name).glob("*/incarnation-0002/trainer.log")
        log2 = log2_path.read_text()
        assert f"resume={status.deaths[0].last_checkpoint}" in log2
        # The real TicketWorkflow holds the hunting ticket until wayne approves its dispatch.
        ticket_handle = temporal_client.get_workflow_handle_for(TicketWorkflow.run, f"ticket-{ticket_id}")
        ticket = await wait_for(ticket_handle, status_is(TicketStatus.AWAITING_APPROVAL))
        assert ticket.spec.id == ticket_id and ticket.spec.kind is TicketKind.HUNT
        assert ticket.spec.agent is not None and ticket.spec.agent.name is AgentName.CODEX
        assert ticket.spec.engine == hunt.engine and ticket.spec.host == spec.host
        for death in status.deaths:
            assert death.id in ticket.spec.spec and str(death.curve_path) in ticket.spec.spec
        assert ticket.pending_decision is not None and ticket.pending_decision.kind is DecisionKind.DISPATCH
        assert ticket.pending_decision.deciders == ["wayne"]
        with Session(sqlite_engine) as session:
            waiting = session.exec(select(TicketRow).where(TicketRow.status == "awaiting_approval")).all()
        assert [(t.ticket_id, t.workflow_id, t.kind, t.agent) for t in waiting] == [
            (ticket_id, f"ticket-{ticket_id}", "hunt", "codex")
        ]
        hunts = [
            w.id
            async for w in temporal_client.list_workflows(f'WorkflowId STARTS_WITH "ticket-hunt-{spec.name}"')
        ]
        assert hunts == [f"ticket-{ticket_id}"]
        described = await ticket_handle.describe()
        assert await described.static_summary() == start_summary(ticket.spec)
        assert described.typed_search_attributes.get(sa.TICKET_ID) == ticket_id
        with pytest.raises(RPCError, match="not found"):
            await temporal_client.get_workflow_handle(f"ticket-hunt-{spec.name}-2").describe()

        # Reminded like a ticket's: wait for one, so the decision below answers a reminded request.
        status = await until(
            handle, lambda s: s.pending_decision is not None and s.pending_decision.reminders_sent >= 1
        )
        request = status.pending_decision
        assert request is not None and request.options == ["restart", "stop"]
        assert request.subject == TrainingRunSubject(run=spec.name)
        await expect_rejected(
            handle.execute_update(
                TrainingRunWorkflow.decide, Decision(request_id="nope", option="stop", decided_by="wayne")
            ),
            "unknown decision request",
        )
        await expect_rejected(
            handle.execute_update(
                TrainingRunWorkflow.decide,
                Decision(request_id=request.id, option="maybe", decided_by="wayne"),
            ),
            "unknown option",
        )
        await expect_rejected(
            handle.execute_update(
                TrainingRunWorkflow.decide, Decision(request_id=request.id, option="stop", decided_by="codex")
            ),
            "may not decide",
        )
        assert (await handle.query(TrainingRunWorkflow.status)).pending_decision == request  # nothing written
        await within(
            handle.execute_update(
                TrainingRunWorkflow.decide, Decision(request_id=request.id, option="stop", decided_by="wayne")
            )
        )
        final = await within(handle.result())
        # The hunt outlives the run (ABANDON); cancel it so the test leaves nothing open.
        await within(
            ticket_handle.execute_update(
                TicketWorkflow.cancel, CancelRequest(requested_by="wayne", reason="test over")
            )
        )
        assert (await within(ticket_handle.result())).status is TicketStatus.CANCELLED
    assert final.state is RunState.STOPPED and final.hunting_tickets == [ticket_id]
    assert not trainers(spec)

    # One audit event per transition, none twice, despite the duplicated reports and the worker restart.
    trail = audit_trail(sqlite_engine, spec)
    reminded = sum(1 for e in trail if e.kind == AuditKind.DECISION_REMINDER)
    assert reminded >= 1
    assert [(e.seq, e.kind) for e in trail] == list(
        enumerate(
            [
                AuditKind.TRAINING,
                AuditKind.DEATH,
                AuditKind.TRAINING,
                AuditKind.DEATH,
                AuditKind.TRAINING,
                AuditKind.DEATH,
                AuditKind.HUNT,
                AuditKind.DECISION_REQUESTED,
                *[AuditKind.DECISION_REMINDER] * reminded,
                AuditKind.DECIDED,
                AuditKind.CLOSED,
            ],
            start=1,
        )
    )
    starts = [e for e in trail if e.kind == AuditKind.TRAINING]
    assert [e.summary.split(" incarnation")[0] for e in starts] == ["started", "restarted", "restarted"]
    assert starts[1].detail["resume_from"] == final.deaths[0].last_checkpoint
    deaths = [e for e in trail if e.kind == AuditKind.DEATH]
    assert [(e.detail["death_id"], e.detail["class"]) for e in deaths] == [
        (d.id, "watchdog_stop") for d in final.deaths
    ]
    assert all(d.summary in e.summary for d, e in zip(final.deaths, deaths, strict=True))
    assert [e.detail["death_counter"] for e in deaths] == ["1", "2", "3"]
    assert trail[6].detail["ticket"] == ticket_id
    assert (trail[-2].actor, trail[-1].actor, trail[-1].status) == ("wayne", "wayne", "stopped")
    with Session(sqlite_engine) as session:
        asked = session.get(DecisionRow, request.id)
    assert asked is not None and asked.ticket_id == ticket_id
    assert (asked.option, asked.decided_by, asked.channel) == ("stop", "wayne", "cli")
    await replay(handle, "training-desk-escalation.json")


async def test_worker_killed_mid_run_reattaches_without_a_second_trainer(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.05", history_limit=100)
    address = temporal_client.service_client.config.target_host
    host_queue = f"host-{spec.host}"

    def host_worker() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.workflows.training_worker",
                address,
                host_queue,
                str(tmp_path / "artifacts"),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"worker ready"
        return proc

    first = host_worker()
    second: subprocess.Popen[bytes] | None = None
    try:
        async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine, host_worker=False):
            handle = await temporal_client.start_workflow(
                TrainingRunWorkflow.run,
                TrainingRunInput(spec=spec),
                id=spec.workflow_id,
                task_queue=task_queue,
            )
            running = await until(handle, lambda s: s.trainer_pid is not None and s.memory_now is not None)
            pid = running.trainer_pid
            first.kill()
            first.wait()
            await asyncio.sleep(1.0)
            assert [p.pid for p in trainers(spec)] == [pid]  # the trainer outlives its watchdog
            second = host_worker()
            await until(handle, lambda s: s.continued >= 1 and s.trainer_pid == pid, timeout_s=90)
            assert [p.pid for p in trainers(spec)] == [pid]
            [filing] = (tmp_path / "state" / spec.name).iterdir()  # one start of the run, one state directory
            # one incarnation, and the record of what the checkpoint directory held before the run (never pruned)
            assert sorted(p.name for p in filing.iterdir()) == ["checkpoints-before.json", "incarnation-0001"]
            await within(handle.execute_update(TrainingRunWorkflow.stop, StopTraining(requested_by="wayne")))
            final = await within(handle.result())
        assert final.state is RunState.STOPPED
        assert [d.death_class for d in final.deaths] == [DeathClass.REQUESTED_STOP]
        assert final.deaths[0].oom_score_adj == 800
        assert not trainers(spec)
        # The seq travelled across continue-as-new: the death and the end are not lost as "already written".
        assert final.continued >= 1
        trail = audit_trail(sqlite_engine, spec)
        assert [(e.seq, e.kind, e.actor) for e in trail] == [
            (1, AuditKind.TRAINING, "cli"),  # the starter: TrainingRunInput.started_by's default
            (2, AuditKind.DEATH, "watchdog"),
            (3, AuditKind.CLOSED, "wayne"),
        ]
        assert trail[1].detail["class"] == "requested_stop" and trail[2].status == "stopped"
        await replay(handle, "training-reattach.json")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_command_that_does_not_exist_fails_the_run_clearly(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    spec = make_spec(tmp_path).model_copy(update={"command": ["no-such-trainer-xyz"]})
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine):
        handle = await temporal_client.start_workflow(
            TrainingRunWorkflow.run, TrainingRunInput(spec=spec), id=spec.workflow_id, task_queue=task_queue
        )
        with pytest.raises(WorkflowFailureError) as caught:
            await within(handle.result())
    assert "not on PATH" in str(caught.value.cause)
    assert not list((tmp_path / "state" / spec.name).glob("*/incarnation-0001/launch.intent"))
    trail = audit_trail(sqlite_engine, spec)
    assert [(e.seq, e.kind, e.status) for e in trail] == [
        (1, AuditKind.TRAINING, "running"),
        (2, AuditKind.CLOSED, "gave_up"),
    ]
    assert "not on PATH" in trail[1].summary


STORED = sorted(p.name for p in HISTORIES.glob("training-*.json"))
OLDER_THAN_THE_DESK = {
    "training-escalation.json",
    "training-reattach.json",
    "training-v1-escalation.json",
    "training-v1-reattach.json",
}
EVALUATED = {"training-escalation-over-a-proposal.json", "training-evaluation-deployment.json"}


def test_stored_histories_are_there() -> None:
    """v1: recorded before runs wrote audit events (AUDIT_PATCH keeps them replaying); then before the decision
    desk posted escalations to Slack and reminded (DESK_PATCH); then the desk's; then runs that evaluate their
    checkpoints and propose them for a serving preset (EVALUATION_PATCH, tests/workflows/test_training_seed.py)."""
    assert STORED == [
        "training-desk-escalation.json",
        "training-escalation-over-a-proposal.json",
        "training-escalation.json",
        "training-evaluation-deployment.json",
        "training-reattach.json",
        "training-v1-escalation.json",
        "training-v1-reattach.json",
    ]


def marker_text(history: dict[str, Any]) -> str:
    """The decoded payloads of the history's markers (patches, local activities), as one text."""
    texts = []
    for event in history["events"]:
        details = event.get("markerRecordedEventAttributes", {}).get("details", {})
        for payloads in details.values():
            texts += [
                base64.b64decode(p.get("data", "")).decode(errors="replace") for p in payloads["payloads"]
            ]
    return "\n".join(texts)


def activity_types(history: dict[str, Any]) -> set[str]:
    return {
        e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        for e in history["events"]
        if "activityTaskScheduledEventAttributes" in e
    }


@pytest.mark.parametrize("name", STORED)
async def test_stored_histories_replay(name: str) -> None:
    history = json.loads((HISTORIES / name).read_text())
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)
    stored = WorkflowHistory.from_json(f"training-{name}", history)
    for replayed in (stored, split_tasks_after_local_activities(stored)):
        result = await replayer.replay_workflow(replayed, raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{name}: {result.replay_failure}"
    kinds = activity_types(history)
    evaluated = name in EVALUATED
    # Audit events: none in v1; one remote activity each, then one local activity's marker each.
    assert ("record_audit_event" in kinds) == ("-v1-" not in name and not evaluated)
    assert ("record_audit_event" in marker_text(history)) == evaluated
    # The desk's requests post to Slack; the older ones replay without the notifications.
    assert ("notify_decision_request" in kinds) == (name not in OLDER_THAN_THE_DESK)
    assert ("evaluate_checkpoint" in kinds) == evaluated
    assert ("training-checkpoint-evaluation" in marker_text(history)) == evaluated
