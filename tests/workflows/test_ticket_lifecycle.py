"""TicketWorkflow end to end on the real dev server, with real git worktrees and real gate commands."""

import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus import services as daedalus
from daedalus.schemas.gates import Verdict
from daedalus.schemas.ticket import AttemptOutcome, Decision, TicketState, TicketStatus
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.ticket import TicketWorkflow
from tests.support import (
    failing_spec,
    gate_command,
    make_engine_repo,
    running_workers,
    start_ticket,
    ticket_spec,
    wait_for,
)


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
async def test_ticket_passes_and_every_transition_is_audited(
    temporal_client: Client, store_engine: Engine, tmp_path: Path, task_queue: str, sandboxed: bool
) -> None:
    """The same with workflow code outside Temporal's sandbox (DAEDALUS_TEMPORAL_SANDBOX=false)."""
    host = f"h-{task_queue[-8:]}"
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host)
    async with running_workers(
        temporal_client, store_engine, tmp_path, task_queue, host, sandboxed=sandboxed
    ):
        handle = await start_ticket(temporal_client, spec, task_queue)
        state = await handle.result()
    assert state.status is TicketStatus.PASSED, state.outcome_reason
    [attempt] = state.attempts
    assert attempt.outcome is AttemptOutcome.GATES_PASSED
    assert attempt.gate_results[0].verdict is Verdict.PASS
    assert 55.5 < (attempt.gate_results[0].median or 0) < 56.5
    with session_scope(store_engine) as session:
        events = queries.audit_events(session=session, ticket_id=spec.id)
        ticket = queries.get_ticket(session=session, ticket_id=spec.id)
        verdict_rows = queries.verdicts(session=session, ticket_id=spec.id)
    assert [e.seq for e in events] == list(range(1, state.audit_seq + 1))
    assert events[0].kind == "filed" and events[-1].kind == "transition" and events[-1].status == "passed"
    assert ticket is not None and ticket.status == "passed" and ticket.closed_at is not None
    assert ticket.spec["id"] == spec.id
    [row] = verdict_rows
    assert row.verdict == "PASS" and len(row.samples) == 7 and row.commit == attempt.commit


async def test_failed_gate_retries_with_evidence_then_escalates(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"h-{task_queue[-8:]}"
    spec = failing_spec(tmp_path, host, max_attempts=3)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await start_ticket(temporal_client, spec, task_queue)
        state = await wait_for(handle, lambda s: s.pending_decision is not None)
        request = state.pending_decision
        assert request is not None and request.kind.value == "escalation"
        # The same failure twice stops the loop before max_attempts is used up.
        assert "the same failure twice" in request.question
        assert [a.outcome for a in state.attempts] == [AttemptOutcome.GATES_FAILED] * 2
        assert "decode: FAIL" in state.attempts[0].detail
        await handle.execute_update(
            TicketWorkflow.decide,
            Decision(request_id=request.id, option="stop", decided_by="wayne", note="rules"),
        )
        final = await handle.result()
    assert final.status is TicketStatus.STOPPED_BY_RULES
    assert "wayne" in final.outcome_reason
    # The retry's brief carried the first attempt's failure evidence.
    brief = (tmp_path / "artifacts" / "tickets" / spec.id / "attempt-2" / "prompt.md").read_text()
    assert "Previous attempt 1" in brief and "decode: FAIL" in brief


async def test_exception_gate_closes_under_exception(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"h-{task_queue[-8:]}"
    repo = make_engine_repo(tmp_path / "repo")
    (repo / "batch.txt").write_text("231.9\n")
    gates = [
        {"name": "single-user", "metric": "decode_tps", "threshold": 55, "command": gate_command()},
        {
            "name": "batch8-vs-ar",
            "metric": "decode_tps",
            "kind": "ab",
            "threshold": 1.0,
            "command": gate_command().replace("speed.txt", "batch.txt") + " --baseline ar.txt",
        },
    ]
    (repo / "ar.txt").write_text("274.9\n")
    import subprocess

    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "batch"], cwd=repo, check=True
    )
    spec = ticket_spec(repo, host, gates=gates, exception_gates=["batch8-vs-ar"])
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        state = await (await start_ticket(temporal_client, spec, task_queue)).result()
    assert state.status is TicketStatus.CLOSED_UNDER_EXCEPTION, state.outcome_reason
    verdicts = {r.gate: r.verdict for r in state.attempts[0].gate_results}
    assert verdicts == {"single-user": Verdict.PASS, "batch8-vs-ar": Verdict.FAIL}


async def test_a_refiled_ticket_runs_its_agent_again_and_keeps_the_earlier_attempt(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"h-{task_queue[-8:]}"
    repo = make_engine_repo(tmp_path / "repo")
    spec = ticket_spec(repo, host)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        first = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        assert (await first.result()).status is TicketStatus.PASSED
        second = await daedalus.file_ticket(temporal_client, spec, queue=task_queue)
        state: TicketState = TicketState.model_validate(await second.result())
    assert state.status is TicketStatus.PASSED
    tickets = tmp_path / "artifacts" / "tickets" / spec.id
    earlier = first.result_run_id or ""
    assert (tickets / "attempt-1" / "filing").read_text() == second.result_run_id
    assert (tickets / f"attempt-1.{earlier[:8]}" / "result.json").exists()  # set aside, not overwritten
    branches = subprocess.run(
        ["git", "branch", "--list", "daedalus/*"], cwd=repo, capture_output=True, text=True
    )
    assert f"daedalus/{spec.id}/attempt-1.{earlier[:8]}" in branches.stdout
    with session_scope(sqlite_engine) as session:
        attempts = [
            e for e in queries.audit_events(session=session, ticket_id=spec.id) if e.kind == "attempt"
        ]
    assert len(attempts) == 2 and all("committed" in e.summary for e in attempts)
