"""TicketWorkflow's decisions on the real dev server: approval, delegation, the validator, reminders,
escalation options, amend and cancel, and ticket ids. Every request goes through `daedalus.services`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus import services as daedalus
from daedalus.agents.settings import AgentSettings
from daedalus.devserver import DevServer
from daedalus.schemas.gates import Verdict
from daedalus.schemas.ticket import (
    AttemptOutcome,
    CancelRequest,
    Decision,
    DecisionKind,
    DecisionRequest,
    Delegation,
    SpecAmendment,
    TicketState,
    TicketStatus,
)
from daedalus.services import RequestRefused
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.ticket import TicketWorkflow
from tests.support import failing_spec, make_engine_repo, running_workers, status_is, ticket_spec, wait_for
from tests.ticket_helpers import (
    events,
    host_of,
    kinds,
    pending,
    sleep_marker,
    sleepers,
    until_gone,
)

APPROVAL = {"dispatch_requires_approval": True, "deciders": ["wayne"]}


async def test_dispatch_approved_by_wayne_passes(
    temporal_client: Client, store_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)
    async with running_workers(temporal_client, store_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue, filed_by="wayne")
        state, request = await pending(handle)
        assert state.status is TicketStatus.AWAITING_APPROVAL and not state.attempts
        assert request.kind is DecisionKind.DISPATCH and request.options == ["approve", "reject"]
        assert request.id == f"{spec.id}-dispatch-1" and request.deciders == ["wayne"]
        with session_scope(store_engine) as session:
            [row] = queries.decisions(session=session, ticket_id=spec.id, pending=True)
            ticket = queries.get_ticket(session=session, ticket_id=spec.id)
        assert row.request_id == request.id and ticket is not None and ticket.awaiting == "wayne"
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="approve", decided_by="wayne"),
            store=store_engine,
        )
        final = await handle.result()
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    assert [d.decided_by for d in final.decisions] == ["wayne"]
    rows = events(store_engine, spec.id)
    decided = [r for r in rows if r.kind == "decided"]
    assert len(decided) == 1 and decided[0].actor == "wayne" and decided[0].detail["option"] == "approve"
    # The decision comes before any work is dispatched.
    assert kinds(rows).index("decided") < kinds(rows).index("attempt")
    with session_scope(store_engine) as session:
        [row] = queries.decisions(session=session, ticket_id=spec.id)
    assert row.option == "approve" and row.decided_by == "wayne" and row.decided_at is not None


async def test_dispatch_rejected_cancels_without_dispatching(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        _, request = await pending(handle)
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="reject", decided_by="wayne", note="not this sprint"),
            store=sqlite_engine,
        )
        final = await handle.result()
    assert final.status is TicketStatus.CANCELLED
    assert final.outcome_reason == "dispatch rejected by wayne: not this sprint"
    assert final.attempts == []
    assert "attempt" not in kinds(events(sqlite_engine, spec.id))
    assert not (tmp_path / "artifacts" / "tickets" / spec.id).exists()


async def test_delegate_named_in_the_spec_approves(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    approval = {**APPROVAL, "delegates": {"dispatch": ["lead"]}}
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=approval)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        _, request = await pending(handle)
        assert request.delegates == ["lead"]
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="approve", decided_by="lead", channel="slack"),
            store=sqlite_engine,
        )
        final = await handle.result()
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    [decided] = [r for r in events(sqlite_engine, spec.id) if r.kind == "decided"]
    assert decided.actor == "lead" and decided.detail["channel"] == "slack"


async def test_runtime_delegation_lets_the_lead_approve(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        _, request = await pending(handle)
        by_lead = Decision(request_id=request.id, option="approve", decided_by="lead")
        with pytest.raises(RequestRefused, match="lead may not decide dispatch"):
            await daedalus.decide(temporal_client, by_lead, store=sqlite_engine)
        people = await daedalus.delegate(
            temporal_client,
            spec.id,
            Delegation(granted_by="wayne", delegate="lead", kind=DecisionKind.DISPATCH),
        )
        assert people == ["lead"]
        state = await handle.query(TicketWorkflow.state)
        assert state.pending_decision is not None and state.pending_decision.delegates == ["lead"]
        await daedalus.decide(temporal_client, by_lead, store=sqlite_engine)
        final = await handle.result()
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    rows = events(sqlite_engine, spec.id)
    [delegated] = [r for r in rows if r.kind == "delegated"]
    assert delegated.actor == "wayne" and delegated.detail == {
        "kind": "dispatch",
        "delegate": "lead",
        "channel": "cli",
    }
    [decided] = [r for r in rows if r.kind == "decided"]
    assert decided.actor == "lead" and delegated.seq < decided.seq


async def test_validator_rejections_are_clear_and_write_nothing(
    temporal_client: Client, store_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)

    async with running_workers(temporal_client, store_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        before, request = await pending(handle)
        written = len(events(store_engine, spec.id))
        assert written == before.audit_seq

        async def refused(call: object, fragment: str) -> None:
            with pytest.raises(RequestRefused) as caught:
                await call  # type: ignore[misc]
            assert fragment in str(caught.value), str(caught.value)
            assert str(caught.value).startswith(f"ticket {spec.id}")
            state = await handle.query(TicketWorkflow.state)
            assert state.audit_seq == before.audit_seq and state.decisions == []
            assert state.pending_decision is not None and state.pending_decision.id == request.id
            rows = events(store_engine, spec.id)
            assert len(rows) == written and "decided" not in kinds(rows) and "delegated" not in kinds(rows)

        # A request the store does not know never reaches a workflow; one it knows is checked by the ticket.
        with pytest.raises(
            RequestRefused, match=f"unknown decision request '{spec.id}-dispatch-7': no ticket"
        ):
            await daedalus.decide(
                temporal_client,
                Decision(request_id=f"{spec.id}-dispatch-7", option="approve", decided_by="wayne"),
                store=store_engine,
            )
        await refused(
            daedalus.decide(
                temporal_client,
                Decision(request_id=f"{spec.id}-dispatch-7", option="approve", decided_by="wayne"),
                subject=request.subject,
            ),
            f"unknown decision request '{spec.id}-dispatch-7'; the pending one is '{request.id}'",
        )
        await refused(
            daedalus.decide(
                temporal_client,
                Decision(request_id=request.id, option="ship-it", decided_by="wayne"),
                store=store_engine,
            ),
            "unknown option 'ship-it'",
        )
        await refused(
            daedalus.decide(
                temporal_client,
                Decision(request_id=request.id, option="approve", decided_by="mallory"),
                store=store_engine,
            ),
            "mallory may not decide dispatch",
        )
        await refused(
            daedalus.delegate(temporal_client, spec.id, Delegation(granted_by="mallory", delegate="lead")),
            "mallory is not a decider",
        )
        await refused(
            daedalus.amend(temporal_client, spec.id, SpecAmendment(amended_by="wayne")),
            "an amendment must change",
        )
        await refused(
            daedalus.amend(temporal_client, spec.id, SpecAmendment(amended_by="mallory", max_attempts=9)),
            "mallory may not amend",
        )
        await refused(
            daedalus.cancel(
                temporal_client, spec.id, CancelRequest(requested_by="mallory", reason="mine now")
            ),
            "mallory may not cancel",
        )
        with pytest.raises(RequestRefused, match="unknown decision request 'approve-it'"):
            await daedalus.decide(
                temporal_client,
                Decision(request_id="approve-it", option="approve", decided_by="wayne"),
                store=store_engine,
            )

        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="approve", decided_by="wayne"),
            store=store_engine,
        )
        final = await handle.result()
        assert final.status is TicketStatus.PASSED

        closed = len(events(store_engine, spec.id))
        assert closed == final.audit_seq
        for call in (
            daedalus.amend(temporal_client, spec.id, SpecAmendment(amended_by="wayne", spec="faster")),
            daedalus.cancel(temporal_client, spec.id, CancelRequest(requested_by="wayne", reason="too late")),
            daedalus.decide(
                temporal_client,
                Decision(request_id=request.id, option="approve", decided_by="wayne"),
                store=store_engine,
            ),
        ):
            with pytest.raises(RequestRefused, match=f"ticket {spec.id} is not live"):
                await call
        assert len(events(store_engine, spec.id)) == closed
        assert (await handle.query(TicketWorkflow.state)).audit_seq == final.audit_seq


async def test_reminders_while_a_decision_waits(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"), host, approval={**APPROVAL, "reminder_interval_s": 1}
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        state = await wait_for(
            handle,
            lambda s: s.pending_decision is not None and s.pending_decision.reminders_sent >= 2,
            timeout=30,
        )
        assert state.pending_decision is not None
        await daedalus.decide(
            temporal_client,
            Decision(request_id=state.pending_decision.id, option="approve", decided_by="wayne"),
            store=sqlite_engine,
        )
        final = await handle.result()
    assert final.status is TicketStatus.PASSED
    rows = events(sqlite_engine, spec.id)
    reminders = [r for r in rows if r.kind == "decision_reminder"]
    assert len(reminders) >= 2
    assert reminders[0].summary == f"reminder 1: {spec.id}-dispatch-1 still waits for a decision"
    assert all(r.status == "awaiting_approval" for r in reminders)
    # Reminders stop once the decision is made.
    assert max(r.seq for r in reminders) < next(r.seq for r in rows if r.kind == "decided")


@pytest.mark.parametrize(
    ("option", "status", "reason"),
    [
        ("accept", TicketStatus.PASSED, "accepted by wayne: good enough"),
        ("close-under-exception", TicketStatus.CLOSED_UNDER_EXCEPTION, "closed under an exception by wayne"),
        ("fail", TicketStatus.FAILED, "failed by wayne: good enough"),
    ],
)
async def test_escalation_options_close_the_ticket(
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
    option: str,
    status: TicketStatus,
    reason: str,
) -> None:
    host = host_of(task_queue)
    spec = failing_spec(tmp_path, host, max_attempts=1)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        state, request = await pending(handle)
        assert state.status is TicketStatus.AWAITING_DECISION
        assert request.kind is DecisionKind.ESCALATION and "1 of 1 attempts used" in request.question
        assert request.options == ["retry", "accept", "close-under-exception", "fail", "stop"]
        assert "decode: FAIL" in request.evidence[0]
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option=option, decided_by="wayne", note="good enough"),
            store=sqlite_engine,
        )
        final = await handle.result()
    assert final.status is status
    assert final.outcome_reason.startswith(reason)
    assert len(final.attempts) == 1
    last = events(sqlite_engine, spec.id)[-1]
    assert last.status == status.value and last.summary.startswith(f"closed {status.value}")


async def test_invalid_gate_is_rerun_before_escalating(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    gates = [
        {
            "name": "decode",
            "metric": "decode_tps",
            "threshold": 55,
            "command": "echo 'no GPU found' >&2; exit 3",
        }
    ]
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, gates=gates, max_attempts=1)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        state, request = await pending(handle)
        assert "could not decide after reruns" in request.question
        [attempt] = state.attempts
        assert attempt.outcome is AttemptOutcome.GATES_FAILED
        assert attempt.gate_results[0].verdict is Verdict.INVALID
        assert (
            "exited 3" in attempt.gate_results[0].reason and "no GPU found" in attempt.gate_results[0].reason
        )
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="accept", decided_by="wayne"),
            store=sqlite_engine,
        )
        final = await handle.result()
    assert final.status is TicketStatus.PASSED and final.outcome_reason == "accepted by wayne"
    gates_run = [r for r in events(sqlite_engine, spec.id) if r.kind == "gate"]
    assert [(g.detail["round"], g.detail["verdict"]) for g in gates_run] == [
        ("1", "INVALID"),
        ("2", "INVALID"),
    ]
    with session_scope(sqlite_engine) as session:
        assert [v.verdict for v in queries.verdicts(session=session, ticket_id=spec.id)] == [
            "INVALID",
            "INVALID",
        ]


async def test_retry_grants_one_more_attempt(
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = host_of(task_queue)
    source = tmp_path / "what-the-agent-writes.txt"
    source.write_text("40.0\n")
    # The scripted agent's commands run in the worktree's sandbox: the file it copies must be shown to it.
    agent = AgentSettings(sandbox_read_only=[str(source)])
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"),
        host,
        agent={"name": "scripted", "commands": [f"cp {source} speed.txt"]},
        max_attempts=1,
    )
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host, agent=agent):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        _, request = await pending(handle)
        source.write_text("56.0\n")  # what the next attempt will do differently
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="retry", decided_by="wayne"),
            store=sqlite_engine,
        )
        final = await handle.result()
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    assert final.outcome_reason == "all 1 gates passed on attempt 2"
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.GATES_FAILED, AttemptOutcome.GATES_PASSED]
    brief = (tmp_path / "artifacts" / "tickets" / spec.id / "attempt-2" / "prompt.md").read_text()
    assert "This is attempt 2 of 2." in brief and "Previous attempt 1 (gates_failed)" in brief


async def test_amend_changes_the_brief_of_the_next_attempt(
    temporal_client: Client, store_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = failing_spec(tmp_path, host, max_attempts=1)
    async with running_workers(temporal_client, store_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        _, request = await pending(handle)
        amended = await daedalus.amend(
            temporal_client,
            spec.id,
            SpecAmendment(
                amended_by="wayne",
                spec="Use the fused MTP kernel; do not touch the sampler.",
                constraints=["keep temp-0 identity"],
                note="after the first miss",
            ),
        )
        assert amended.spec.spec.startswith("Use the fused MTP kernel")
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="retry", decided_by="wayne"),
            store=store_engine,
        )
        _, second = await pending(handle)
        await daedalus.decide(
            temporal_client,
            Decision(request_id=second.id, option="stop", decided_by="wayne"),
            store=store_engine,
        )
        final = await handle.result()
    assert final.status is TicketStatus.STOPPED_BY_RULES
    artifacts = tmp_path / "artifacts" / "tickets" / spec.id
    first, retry = ((artifacts / f"attempt-{n}" / "prompt.md").read_text() for n in (1, 2))
    assert "Make single-user decode reach 55 tok/s." in first and "fused MTP kernel" not in first
    assert "Use the fused MTP kernel; do not touch the sampler." in retry and "keep temp-0 identity" in retry
    assert "Make single-user decode reach 55 tok/s." not in retry
    rows = events(store_engine, spec.id)
    [amend_event] = [r for r in rows if r.kind == "amended"]
    assert amend_event.actor == "wayne" and "after the first miss" in amend_event.summary
    with session_scope(store_engine) as session:
        ticket = queries.get_ticket(session=session, ticket_id=spec.id)
    assert ticket is not None and ticket.spec["spec"] == "Use the fused MTP kernel; do not touch the sampler."


async def _cancel_mid_build(
    client: Client, engine: Engine, tmp_path: Path, task_queue: str
) -> tuple[TicketState, float, list[str]]:
    """File a ticket whose build runs two long sleeps, cancel it mid-build; the state, kill time and trail."""
    host = host_of(task_queue)
    marker = sleep_marker()
    spec = ticket_spec(
        make_engine_repo(tmp_path / "repo"), host, build={"command": f"sleep {marker} & sleep {marker}; wait"}
    )
    async with running_workers(client, engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(client, spec, queue=task_queue)
        await wait_for(handle, status_is(TicketStatus.BUILDING))
        for _ in range(100):
            if len(sleepers(marker)) == 2:
                break
            await asyncio.sleep(0.1)
        assert len(sleepers(marker)) == 2, "the build's two sleeps never started"
        await daedalus.cancel(client, spec.id, CancelRequest(requested_by="wayne", reason="wrong base"))
        final = await handle.result()
        took = await until_gone(marker, timeout=30)
    rows = events(engine, spec.id)
    assert [r.seq for r in rows] == list(range(1, final.audit_seq + 1))
    last = rows[-1]
    assert last.status == "cancelled" and last.actor == "wayne" and "wrong base" in last.summary
    return final, took, [r.summary for r in rows]


async def test_cancel_during_build_kills_its_process_group(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    final, took, trail = await _cancel_mid_build(temporal_client, sqlite_engine, tmp_path, task_queue)
    assert final.status is TicketStatus.CANCELLED
    assert final.outcome_reason == "cancelled by wayne: wrong base"
    assert took < 30  # every process of the build's group is gone
    # The cancelled step is a cancelled attempt, not a failed build followed by another attempt.
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.CANCELLED]
    assert not [s for s in trail if "build failed" in s or "attempt 2" in s], trail


async def test_duplicate_live_id_is_refused_and_a_closed_id_can_be_filed_again(
    temporal_client: Client, store_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = host_of(task_queue)
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)
    async with running_workers(temporal_client, store_engine, tmp_path, task_queue, host):
        first = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        _, request = await pending(first)
        with pytest.raises(RequestRefused, match=f"ticket {spec.id} is already live"):
            await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="reject", decided_by="wayne"),
            store=store_engine,
        )
        assert (await first.result()).status is TicketStatus.CANCELLED

        again = await daedalus.file_ticket(temporal_client, spec, queue=task_queue, filed_by="lead")
        _, request = await pending(again)
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="approve", decided_by="wayne"),
            store=store_engine,
        )
        assert (await again.result()).status is TicketStatus.PASSED
    first_run, again_run = first.result_run_id, again.result_run_id
    assert first_run is not None and again_run is not None and first_run != again_run
    rows = events(store_engine, spec.id)
    runs: dict[str, list[int]] = {}
    for row in rows:
        runs.setdefault(row.run_id, []).append(row.seq)
    assert set(runs) == {first_run, again_run}
    for seqs in runs.values():
        assert sorted(seqs) == list(range(1, len(seqs) + 1))
    trail = {row.run_id: row for row in rows if row.kind == "filed"}
    assert trail[first_run].actor == "cli" and trail[again_run].actor == "lead"
    with session_scope(store_engine) as session:
        ticket = queries.get_ticket(session=session, ticket_id=spec.id)
    assert ticket is not None and ticket.run_id == again_run and ticket.status == "passed"


async def test_a_server_side_policy_refuses_before_the_update(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    """The server's rule (here: only wayne dispatches) runs in the service layer; a refusal writes nothing."""
    host = host_of(task_queue)
    approval = {**APPROVAL, "delegates": {"dispatch": ["lead"]}}
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=approval)

    def only_wayne(request: DecisionRequest, decision: Decision) -> str | None:
        return None if decision.decided_by == "wayne" else "the server lets only wayne dispatch"

    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        before, request = await pending(handle)
        by_lead = Decision(request_id=request.id, option="approve", decided_by="lead")
        with pytest.raises(
            RequestRefused, match=f"ticket {spec.id} refused: the server lets only wayne dispatch"
        ):
            await daedalus.decide(temporal_client, by_lead, store=sqlite_engine, policy=only_wayne)
        assert (await handle.query(TicketWorkflow.state)).audit_seq == before.audit_seq
        by_wayne = by_lead.model_copy(update={"decided_by": "wayne"})
        await daedalus.decide(temporal_client, by_wayne, store=sqlite_engine, policy=only_wayne)
        assert (await handle.result()).status is TicketStatus.PASSED


async def test_a_cancellation_sent_to_temporal_is_recorded_as_temporal_with_its_client_and_reason(
    temporal_client: Client,
    temporal_server: DevServer,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    """Not through Daedalus (the Temporal CLI, an SDK client): no person decided it, and the trail says who
    sent it and why, as Temporal's history recorded them."""
    host = host_of(task_queue)
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, spec, queue=task_queue, filed_by="wayne")
        await pending(handle)
        outsider = await Client.connect(temporal_server.address, identity="ops-laptop")
        await outsider.get_workflow_handle(handle.id).cancel(reason="cleaning up old tickets")
        final = await handle.result()
    assert final.status is TicketStatus.CANCELLED
    closed = events(sqlite_engine, spec.id)[-1]
    assert closed.actor == "temporal" and "no person decided it" in closed.summary
    assert (
        "requested by the Temporal client 'ops-laptop' with the reason 'cleaning up old tickets'"
        in closed.summary
    )
    assert closed.detail["cancel_requested_by_client"] == "ops-laptop"
    assert closed.detail["cancel_reason"] == "cleaning up old tickets"
    assert all(row.actor != "temporal" for row in events(sqlite_engine, spec.id) if row.kind == "decided")


async def test_a_refiled_ticket_numbers_its_requests_on_and_its_new_request_waits_in_the_store(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    """The earlier filing's `x-dispatch-1` was answered; the new filing asks `x-dispatch-2`, which the store
    lists as pending (an id asked twice used to keep the old, answered row and lose the new request)."""
    host = host_of(task_queue)
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, approval=APPROVAL)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        first = await daedalus.file_ticket(temporal_client, spec, queue=task_queue, store=sqlite_engine)
        _, request = await pending(first)
        assert request.id == f"{spec.id}-dispatch-1"
        await daedalus.decide(
            temporal_client,
            Decision(request_id=request.id, option="reject", decided_by="wayne"),
            store=sqlite_engine,
        )
        await first.result()
        second = await daedalus.file_ticket(temporal_client, spec, queue=task_queue, store=sqlite_engine)
        _, again = await pending(second)
        assert again.id == f"{spec.id}-dispatch-2"
        with session_scope(sqlite_engine) as session:
            waiting = queries.decisions(session=session, ticket_id=spec.id, pending=True)
            assert [row.request_id for row in waiting] == [again.id]
        await daedalus.decide(
            temporal_client,
            Decision(request_id=again.id, option="approve", decided_by="wayne"),
            store=sqlite_engine,
        )
        final = await second.result()
    assert final.status is TicketStatus.PASSED, final.outcome_reason
