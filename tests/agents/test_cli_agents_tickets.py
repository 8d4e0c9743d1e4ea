"""Tickets worked by the real Codex CLI and Claude Code: the ticket workflow on the real Temporal dev server
dispatches the CLI in its sandbox, the CLI makes the change its model script asks for, and the ticket's build and
gates decide it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.agents.costs import price_for
from daedalus.agents.model_server import ModelServer
from daedalus.schemas.gates import Verdict
from daedalus.schemas.ticket import AttemptOutcome, Decision, TicketStatus
from daedalus.workflows.ticket import TicketWorkflow
from tests.agents.clis import cli_settings, new_key, the_change
from tests.support import make_engine_repo, running_workers, start_ticket, ticket_spec, wait_for


@pytest.mark.parametrize("name", ["codex", "claude"])
async def test_a_ticket_worked_by_the_real_cli_passes_its_gate_and_records_its_cost(
    name: str,
    model_server: ModelServer,
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    host = f"h-{task_queue[-8:]}"
    key = new_key()
    script = model_server.add(key, the_change(name))
    repo = make_engine_repo(tmp_path / "repo")
    spec = ticket_spec(repo, host, agent={"name": name, "budget_usd": 5}, max_attempts=1)
    settings = cli_settings(model_server, key)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host, agent=settings):
        state = await (await start_ticket(temporal_client, spec, task_queue)).result()
    assert state.status is TicketStatus.PASSED, state.outcome_reason
    [attempt] = state.attempts
    assert attempt.outcome is AttemptOutcome.GATES_PASSED, attempt.detail
    assert attempt.gate_results[0].verdict is Verdict.PASS
    assert 55.5 < (attempt.gate_results[0].median or 0) < 56.5
    assert attempt.commit is not None
    shown = subprocess.run(
        ["git", "show", f"{attempt.commit}:speed.txt"], cwd=repo, capture_output=True, text=True, check=True
    )
    assert shown.stdout == "56.0\n"
    sent = script.totals()
    price = price_for("gpt-5-codex" if name == "codex" else "claude-sonnet-4-5")
    assert price is not None and attempt.cost_usd is not None
    listed = (sent.input_tokens * price.input + sent.output_tokens * price.output) / 1e6
    assert attempt.cost_usd == pytest.approx(listed, abs=1e-6)
    assert attempt.cost_source == ("estimated" if name == "codex" else "provider")


async def test_a_cli_change_that_misses_the_gate_fails_it_and_the_ticket_escalates(
    model_server: ModelServer,
    temporal_client: Client,
    sqlite_engine: Engine,
    tmp_path: Path,
    task_queue: str,
) -> None:
    host = f"h-{task_queue[-8:]}"
    key = new_key()
    script = model_server.add(key, the_change("codex", to="40.0"))
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), host, agent={"name": "codex"}, max_attempts=3)
    settings = cli_settings(model_server, key)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host, agent=settings):
        handle = await start_ticket(temporal_client, spec, task_queue)
        state = await wait_for(handle, lambda s: s.pending_decision is not None, timeout=120)
        request = state.pending_decision
        assert request is not None and request.kind.value == "escalation"
        assert [a.outcome for a in state.attempts] == [AttemptOutcome.GATES_FAILED] * 2
        assert "decode: FAIL" in state.attempts[0].detail
        await handle.execute_update(
            TicketWorkflow.decide,
            Decision(request_id=request.id, option="stop", decided_by="wayne", note="t"),
        )
        final = await handle.result()
    assert final.status is TicketStatus.STOPPED_BY_RULES
    # The second attempt's CLI was told why the first failed.
    assert script.first_request is not None
    brief = (tmp_path / "artifacts" / "tickets" / spec.id / "attempt-2" / "prompt.md").read_text()
    assert "decode: FAIL" in brief
