"""The server's policy on the real dev server and store: a ticket (gate-only too) or training run filed by
someone who does not operate its host waits for a dispatch decision by someone else, the request shows the
commands, the filer cannot approve it, a spec cannot loosen it, and the lead's standing delegation works."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from daedalus import services as daedalus
from daedalus.decisions.policy import Policy
from daedalus.decisions.schemas import Delegation, TrainingRunSubject
from daedalus.errors import NotAllowed
from daedalus.schemas.audit import AuditKind
from daedalus.schemas.ticket import Decision, DecisionKind, EngineRef, RepoKind, TicketSpec, TicketStatus
from daedalus.schemas.training import HuntPolicy, RestartPolicy, RunState, StopTraining
from daedalus.services import RequestRefused
from daedalus.slack.settings import SlackSettings
from daedalus.store.tables import DecisionRow
from daedalus.workflows.ticket import TicketWorkflow
from daedalus.workflows.training import TrainingRunWorkflow
from tests.replay_split import replay_split_too
from tests.support import gate_command, make_engine_repo, running_workers, ticket_spec
from tests.ticket_helpers import events, host_of, kinds, pending
from tests.workflows.test_ticket_replay import replayer
from tests.workflows.test_training import audit_trail, make_spec, replay, trainers, until, within, workers


def policy_for(
    host: str, training_dirs: tuple[Path, ...] = (), deciders: tuple[str, ...] = ("wayne",)
) -> Policy:
    """olga operates `host`; training runs there may write under `training_dirs`."""
    return Policy.model_validate(
        {
            "people": {
                **{name: {"roles": ["decider", "filer"]} for name in deciders},
                "lead": {"roles": ["lead"]},
                "olga": {"roles": ["filer", "operator"]},
                "bob": {"roles": ["filer"]},
            },
            "hosts": {host: {"operators": ["olga"], "training_dirs": [str(d) for d in training_dirs]}},
            "delegations": [{"granted_by": "wayne", "delegate": "lead", "kind": "dispatch"}],
        }
    )


def gate_only(repo: Path, host: str) -> TicketSpec:
    """Measures the repository as it stands (about 29 tok/s), with nothing for an agent to do."""
    gates = [{"name": "decode", "metric": "decode_tps", "threshold": 20, "command": gate_command()}]
    return ticket_spec(repo, host, agent=None, build=None, approval={}, gates=gates)


async def test_a_gate_only_ticket_waits_for_a_dispatch_unless_its_filer_operates_the_host(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    repo = make_engine_repo(tmp_path / "repo")
    policy = policy_for(host)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        waiting = gate_only(repo, host)
        handle = await daedalus.file_ticket(
            temporal_client, waiting, queue=task_queue, filed_by="bob", policy=policy
        )
        state, request = await pending(handle)
        assert state.status is TicketStatus.AWAITING_APPROVAL and request.kind is DecisionKind.DISPATCH
        assert (
            f"runs ticket {waiting.id} on {host}: gate decode (in a private checkout of {waiting.engine.repo} at "  # type: ignore[union-attr]
            f"{waiting.engine.base_commit}; no network, no secrets, no GPU but those leased to it): {gate_command()}"  # type: ignore[union-attr]
            in request.evidence
        ), request.evidence
        assert request.excluded == ["bob"] and "bob" not in request.allowed
        assert "gate" not in kinds(events(sqlite_engine, waiting.id))  # nothing ran on the host yet
        # An operator of the host files the same kind of ticket: it measures at once.
        operated = gate_only(repo, host)
        direct = await daedalus.file_ticket(
            temporal_client, operated, queue=task_queue, filed_by="olga", policy=policy
        )
        assert (await within(direct.result())).status is TicketStatus.PASSED
        assert "decision_requested" not in kinds(events(sqlite_engine, operated.id))
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="approve", decided_by="wayne"),
            store=sqlite_engine,
            policy=policy,
        )
        assert (await within(handle.result())).status is TicketStatus.PASSED
    # The rule travels in the input: the new history replays deterministically.
    await replay_split_too(replayer(), await handle.fetch_history())
    filed = events(sqlite_engine, waiting.id)[0]
    assert (
        filed.detail["dispatch"]
        == f"bob does not operate {host}: a dispatch decision by someone else is required"
    )


async def test_the_filer_cannot_approve_their_own_dispatch_nor_can_anyone_acting_for_them(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    policy = policy_for(host, deciders=("wayne", "carol"))
    repo = make_engine_repo(tmp_path / "repo")
    # wayne alone decides: nobody but wayne, or the lead acting for him, could approve it: refused at filing
    alone = ticket_spec(repo, host, approval={"deciders": ["wayne"]})
    with pytest.raises(NotAllowed, match=r"nobody but its filer wayne \(or someone acting for wayne\)"):
        await daedalus.file_ticket(temporal_client, alone, queue=task_queue, filed_by="wayne", policy=policy)
    # wayne is a decider, but he filed this one: carol may approve; the lead, his standing delegate, may not.
    spec = ticket_spec(repo, host, approval={"deciders": ["wayne", "carol"]})
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(
            temporal_client, spec, queue=task_queue, filed_by="wayne", policy=policy
        )
        _, request = await pending(handle)
        assert (
            request.deciders == ["wayne", "carol"]
            and request.delegates == []
            and request.allowed == ["carol"]
        )
        with Session(sqlite_engine) as session:
            row = session.get(DecisionRow, request.id)
        assert row is not None and row.deciders == ["carol"]  # the store lists who may answer, not the filer
        assert any("scripted agent applies a" in line for line in request.evidence)
        assert any(
            "build (in a private checkout" in line and line.endswith("test -f speed.txt")
            for line in request.evidence
        ), request.evidence
        own = Decision(request_id=request.id, option="approve", decided_by="wayne")
        with pytest.raises(NotAllowed, match=r"wayne filed ticket .* and may not decide its dispatch"):
            await daedalus.decide(temporal_client, own, store=sqlite_engine, policy=policy)
        # The workflow's own validator refuses it too, with no policy at hand.
        with pytest.raises(RequestRefused, match="may not decide its dispatch"):
            await daedalus.decide(temporal_client, own, store=sqlite_engine)
        for_wayne = Decision(request_id=request.id, option="approve", decided_by="lead", channel="bot")
        with pytest.raises(
            RequestRefused, match=r"lead may not decide dispatch for ticket .*; allowed: \['carol'\]"
        ):
            await daedalus.decide(temporal_client, for_wayne, store=sqlite_engine, policy=policy)
        # Nor may he hand it to someone else: the delegation is refused before anything is written.
        handover = Delegation(granted_by="wayne", delegate="bob", kind=DecisionKind.DISPATCH)
        with pytest.raises(RequestRefused, match=r"wayne filed ticket .* cannot delegate it either"):
            await daedalus.delegate(temporal_client, spec.id, handover)
        still = (await daedalus.status(temporal_client, spec.id)).pending_decision
        assert (
            still is not None
            and still.delegates == []
            and "delegated" not in kinds(events(sqlite_engine, spec.id))
        )
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="approve", decided_by="carol", channel="bot"),
            store=sqlite_engine,
            policy=policy,
        )
        final = await within(handle.result())
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    assert [d.decided_by for d in final.decisions] == ["carol"]


async def test_a_spec_that_loosens_its_approval_is_refused_before_anything_starts(
    temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    repo = make_engine_repo(tmp_path / "repo")
    loose = ticket_spec(repo, host)  # dispatch_requires_approval: false
    with pytest.raises(NotAllowed) as caught:
        await daedalus.file_ticket(
            temporal_client, loose, queue=task_queue, filed_by="bob", policy=policy_for(host)
        )
    assert str(caught.value) == (
        f"ticket {loose.id}: approval.dispatch_requires_approval: false would let bob run commands on {host} "
        f"without a dispatch decision, and the policy does not make bob an operator of {host}; remove the line "
        f"(someone with authority will approve the dispatch), or ask for bob to be added to the host's "
        f"operators in policy.yaml"
    )
    self_approved = ticket_spec(repo, host, approval={"deciders": ["bob"]})
    with pytest.raises(NotAllowed, match=r"approval.deciders names \['bob'\], who are not deciders"):
        await daedalus.file_ticket(
            temporal_client, self_approved, queue=task_queue, filed_by="bob", policy=policy_for(host)
        )
    for spec in (loose, self_approved):
        with pytest.raises(RPCError) as missing:
            await temporal_client.get_workflow_handle(f"ticket-{spec.id}").describe()
        assert missing.value.status is RPCStatusCode.NOT_FOUND


async def test_a_training_run_waits_for_a_dispatch_unless_its_starter_operates_the_host(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.05")
    policy = policy_for(spec.host, (tmp_path,))
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine, slack=SlackSettings()):
        handle = await daedalus.start_run(
            temporal_client, spec, queue=task_queue, started_by="bob", policy=policy
        )
        status = await until(handle, lambda s: s.pending_decision is not None)
        request = status.pending_decision
        assert request is not None and request.kind is DecisionKind.DISPATCH
        assert (
            status.state is RunState.AWAITING_DECISION and status.trainer_pid is None and not trainers(spec)
        )
        assert any(" ".join(spec.command) in line for line in request.evidence)
        # Every effect is shown: where it checkpoints and what Daedalus will delete there, state, artifacts.
        shown = "\n".join(request.evidence)
        assert f"checkpoints under {tmp_path / 'ckpt'}" in shown and "deletes complete checkpoints" in shown
        assert str(tmp_path / "state") in shown and str(tmp_path / "artifacts") in shown
        subject = TrainingRunSubject(run=spec.name)
        own = Decision(request_id=request.id, option="approve", decided_by="bob")
        with pytest.raises(NotAllowed, match="bob filed training run"):
            await daedalus.decide(temporal_client, own, subject=subject, policy=policy)
        approve = Decision(request_id=request.id, option="approve", decided_by="wayne")
        await daedalus.decide(temporal_client, approve, subject=subject, policy=policy)
        running = await until(handle, lambda s: s.state is RunState.RUNNING and s.trainer_pid is not None)
        assert running.started_by == "bob"
        # Neither its starter, a decider nor an operator of the host: refused before the workflow hears of it.
        with pytest.raises(NotAllowed, match=r"lead may not stop training run .* only its starter \(bob\)"):
            await daedalus.stop_run(
                temporal_client, spec.name, StopTraining(requested_by="lead"), policy=policy
            )
        assert (await handle.query(TrainingRunWorkflow.status)).state is RunState.RUNNING
        await daedalus.stop_run(temporal_client, spec.name, StopTraining(requested_by="bob"), policy=policy)
        assert (await within(handle.result())).state is RunState.STOPPED
        # The dispatch request's notification follows its audit write (a local activity): a status query answered
        # while that write's result was pending puts them in two workflow tasks, which must replay too.
        await replay(handle, record_as=None)
        # The host's operator starts the same run again: no decision, it runs at once.
        again = await daedalus.start_run(
            temporal_client, spec, queue=task_queue, started_by="olga", policy=policy
        )
        await until(again, lambda s: s.state is RunState.RUNNING and s.trainer_pid is not None)
        assert (await again.query(TrainingRunWorkflow.status)).pending_decision is None
        await daedalus.stop_run(temporal_client, spec.name, StopTraining(requested_by="olga"), policy=policy)
        await within(again.result())
    first = [e for e in events(sqlite_engine, spec.workflow_id) if e.run_id == handle.first_execution_run_id]
    assert [(e.kind, e.actor) for e in first][:3] == [
        (AuditKind.DECISION_REQUESTED, "daedalus"),
        (AuditKind.DECIDED, "wayne"),
        (AuditKind.TRAINING, "bob"),  # started by its starter
    ]


async def test_a_rejected_training_dispatch_never_starts_the_trainer(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.05")
    policy = policy_for(spec.host, (tmp_path,))
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine, slack=SlackSettings()):
        handle = await daedalus.start_run(
            temporal_client, spec, queue=task_queue, started_by="bob", policy=policy
        )
        status = await until(handle, lambda s: s.pending_decision is not None)
        assert status.pending_decision is not None
        reject = Decision(request_id=status.pending_decision.id, option="reject", decided_by="lead")
        await daedalus.decide(
            temporal_client, reject, subject=TrainingRunSubject(run=spec.name), policy=policy
        )
        final = await within(handle.result())
    assert final.state is RunState.STOPPED and final.trainer_pid is None and not trainers(spec)
    closed = audit_trail(sqlite_engine, spec)[-1]
    assert closed.kind == AuditKind.CLOSED and closed.summary == "stopped by lead: dispatch rejected"


async def test_a_hunting_ticket_follows_its_runs_dispatch_rule_and_its_starter_cannot_approve_it(
    temporal_client: Client, task_queue: str, tmp_path: Path, sqlite_engine: Engine
) -> None:
    hunt = HuntPolicy(engine=EngineRef(name="trainer", kind=RepoKind.VLLM, repo=str(tmp_path)))
    escalate_at_once = RestartPolicy(restart_delay_s=0.2, escalate_after_deaths=1)
    spec = make_spec(tmp_path, "--mib-per-step", "8", "--step-s", "0.05", hunt=hunt, restart=escalate_at_once)
    policy = policy_for(spec.host, (tmp_path,))
    async with workers(temporal_client, task_queue, spec, tmp_path, sqlite_engine, slack=SlackSettings()):
        handle = await daedalus.start_run(
            temporal_client, spec, queue=task_queue, started_by="bob", policy=policy
        )
        status = await until(handle, lambda s: s.pending_decision is not None)
        assert status.pending_decision is not None
        approve = Decision(request_id=status.pending_decision.id, option="approve", decided_by="wayne")
        subject = TrainingRunSubject(run=spec.name)
        await daedalus.decide(temporal_client, approve, subject=subject, policy=policy)
        status = await until(handle, lambda s: s.hunting_tickets != [] and s.pending_decision is not None)
        [ticket_id] = status.hunting_tickets
        ticket = temporal_client.get_workflow_handle_for(TicketWorkflow.run, f"ticket-{ticket_id}")
        try:
            _, request = await pending(ticket)
            assert request.kind is DecisionKind.DISPATCH and request.excluded == ["bob"]
            assert "bob" not in request.allowed and "wayne" in request.allowed
            assert any(
                line.startswith(f"runs ticket {ticket_id} on {spec.host}") for line in request.evidence
            )
            own = Decision(request_id=request.id, option="approve", decided_by="bob")
            with pytest.raises(NotAllowed, match=rf"bob filed ticket {ticket_id} and may not decide"):
                await daedalus.decide(temporal_client, own, store=sqlite_engine, policy=policy)
        finally:
            await ticket.terminate("test over")
        await daedalus.stop_run(temporal_client, spec.name, StopTraining(requested_by="wayne"), policy=policy)
        await within(handle.result())
