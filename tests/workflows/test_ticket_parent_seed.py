"""Seed ticket 6's parent and its measurement sub-tickets (issue 26 item 2): a parent does not pass while a
sub-ticket failed (patch parent-answers-for-children), and a ticket without an agent builds and measures its engine
at the commit its sub-tickets' work was accepted at (patch measures-what-was-accepted): ticket 6's own gates
measure 6b-6f's result, and 6c and 6f measure their predecessors' build, never the host's install or the base.

Real dev server, real workers, real git and bubblewrap; the engine is the toy repo whose `speed.txt` the gates read
(tests/fixtures/emit_samples.py), so these run in seconds. The vLLM version of the chain,
examples/tickets/local-6.yaml, runs through `daedalus demo --ticket`; its lanes are measured on vLLM by
tests/engines/test_vllm_seed_lanes.py, the chain itself is not run on vLLM in `make test`.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from temporalio.client import Client, WorkflowHandle

from daedalus import services as daedalus
from daedalus.schemas.gates import Verdict
from daedalus.schemas.ticket import Decision, EngineRef, TicketSpec, TicketState, TicketStatus
from daedalus.workflows import ticket_rules as rules
from daedalus.workflows.ticket import TicketWorkflow
from tests.replay_split import replay_split_too
from tests.support import SLOW_PATCH, gate_command, make_engine_repo, running_workers, ticket_spec
from tests.ticket_helpers import HISTORIES, pending, started
from tests.workflows.test_ticket_replay import replayer

BUILT = "built.txt"


def parent_spec(repo: Path, host: str, *children: TicketSpec, threshold: float, **extra: Any) -> TicketSpec:
    """An umbrella with an engine, a build and a gate of its own, and no agent (ticket 6's shape)."""
    return TicketSpec.model_validate(
        {
            "id": f"p{uuid.uuid4().hex[:8]}",
            "title": "TP4 MTP umbrella (test)",
            "kind": "umbrella",
            "host": host,
            "engine": {"name": "toy", "kind": "llama_cpp", "repo": str(repo), "base_commit": "main"},
            # The gate measures only what the build made: without the build, it cannot run (INVALID).
            "build": {"command": f"test -f speed.txt && cp speed.txt {BUILT}"},
            "gates": [
                {
                    "name": "decode",
                    "metric": "decode_tps",
                    "threshold": threshold,
                    "command": gate_command().replace("speed.txt", BUILT),
                }
            ],
            "children": [c.model_dump(mode="json") for c in children],
            **extra,
        }
    )


async def keep(handle: WorkflowHandle[Any, TicketState], name: str) -> None:
    """Replay the fresh history (split after its local activities too); store it when asked to record."""
    history = await handle.fetch_history()
    await replay_split_too(replayer(), history)
    if os.environ.get("DAEDALUS_RECORD_HISTORIES"):
        (HISTORIES / f"ticket-batched-{name}.json").write_text(history.to_json())


def test_a_passing_parent_answers_for_its_children() -> None:
    passed = (TicketStatus.PASSED, "all 3 gates passed on attempt 1")
    assert rules.answering_for_children(passed, {}) == passed
    assert rules.answering_for_children(passed, {"6b": TicketStatus.PASSED}) == passed
    failed = rules.answering_for_children(passed, {"6b": TicketStatus.PASSED, "6c": TicketStatus.FAILED})
    assert (
        failed[0] is TicketStatus.FAILED
        and "all 3 gates passed" in failed[1]
        and "'6c': 'failed'" in failed[1]
    )
    excepted = rules.answering_for_children(passed, {"6f": TicketStatus.CLOSED_UNDER_EXCEPTION})
    assert excepted[0] is TicketStatus.CLOSED_UNDER_EXCEPTION
    stopped = (TicketStatus.STOPPED_BY_RULES, "the same failure twice")
    assert rules.answering_for_children(stopped, {"6c": TicketStatus.FAILED}) == stopped


def test_a_ticket_without_an_agent_measures_what_its_children_accepted() -> None:
    spec = TicketSpec.model_validate(
        {
            "id": "6",
            "title": "t",
            "host": "h",
            "gates": [{"name": "g", "metric": "decode_tps", "threshold": 65, "command": "x"}],
            "engine": {"name": "1cat-vllm", "kind": "vllm", "repo": "/r", "base_commit": "9d9d3c4"},
        }
    )
    assert rules.measured_engine(spec, None) == spec.engine
    measured = rules.measured_engine(spec, "ed8693a")
    assert isinstance(measured, EngineRef) and measured.base_commit == "ed8693a" and measured.repo == "/r"


async def test_seed_parent_whose_own_gates_pass_fails_with_a_failed_child(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"h-{task_queue[-8:]}"
    repo = make_engine_repo(tmp_path / "repo")  # speed.txt: 28.9
    # Its one attempt makes speed.txt 40.0: its gate (>= 55) FAILs.
    slow = {"name": "scripted", "patch": SLOW_PATCH}
    child = ticket_spec(repo, host, id=f"c{uuid.uuid4().hex[:7]}", max_attempts=1, agent=slow)
    parent = parent_spec(repo, host, child, threshold=20)  # the base's 28.9 clears it
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, parent, queue=task_queue)
        kid = await started(temporal_client, child.id)
        _, request = await pending(kid, timeout=120)  # its one attempt failed its gate: wayne decides
        await kid.execute_update(
            TicketWorkflow.decide, Decision(request_id=request.id, option="fail", decided_by="wayne")
        )
        final = await handle.result()
    assert final.children == {child.id: TicketStatus.FAILED}
    [measured] = final.attempts
    assert [r.verdict for r in measured.gate_results] == [Verdict.PASS]  # the parent's own gate passed ...
    assert final.status is TicketStatus.FAILED, final.outcome_reason  # ... and still it does not pass
    assert "all 1 gates passed" in final.outcome_reason and "sub-tickets did not pass" in final.outcome_reason
    await keep(handle, "parent-answers-for-children")


async def test_seed_parent_builds_and_measures_its_childrens_accepted_commit(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    host = f"h-{task_queue[-8:]}"
    repo = make_engine_repo(tmp_path / "repo")  # speed.txt: 28.9 at the base; the child's patch makes it 56.0
    child = ticket_spec(repo, host, id=f"c{uuid.uuid4().hex[:7]}")
    parent = parent_spec(repo, host, child, threshold=55)
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await daedalus.file_ticket(temporal_client, parent, queue=task_queue)
        final = await handle.result()
        kid = await daedalus.status(temporal_client, child.id)
    assert final.status is TicketStatus.PASSED, final.outcome_reason
    [accepted] = [a.commit for a in kid.attempts]
    [measured] = final.attempts
    [decode] = measured.gate_results
    # 56.0 is the child's speed: measured at its accepted commit (the base's 28.9 would FAIL), after the build.
    assert decode.verdict is Verdict.PASS and decode.median is not None and 55 < decode.median < 57
    assert accepted is not None and decode.commit == accepted
    worktree = tmp_path / "ws" / host / "worktrees" / parent.id / "attempt-1"
    assert (worktree / BUILT).read_text().strip() == "56.0"
    await keep(handle, "parent-measures-accepted-commit")
