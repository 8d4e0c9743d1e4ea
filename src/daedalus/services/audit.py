"""Verifying the audit record against what no database writer can reach: the audit key and Temporal itself.

`verify` recomputes every trail's chain and seals in the store (daedalus.store.chain), then asks every
workflow that keeps a trail how far its trail got (its `audit_head` query, answered from its own history) and
holds the store to it: a trail cut short, or deleted whole, while Temporal still knows its workflow, shows.
Workflows past Temporal's retention cannot be asked; their trails rest on the chain and seals alone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import Engine, func
from sqlmodel import select
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
from temporalio.service import RPCError

from daedalus.ids import (
    CAMPAIGN_PREFIX,
    QUESTION_SUBJECT,
    TRAINING_PREFIX,
    question_workflow_id,
    ticket_workflow_id,
)
from daedalus.schemas.audit import AuditKind, TrailHead
from daedalus.store import chain
from daedalus.store.chain import BreakKind, ChainBreak
from daedalus.store.database import session_scope
from daedalus.store.seals import AuditKey
from daedalus.store.tables import AuditEventRow
from daedalus.workflows.trail import AUDIT_HEAD_QUERY

TRAIL_WORKFLOWS = ("TicketWorkflow", "TrainingRunWorkflow", "CampaignWorkflow", "QuestionWorkflow")
QUERY_TIMEOUT = timedelta(seconds=10)
CONCURRENT_QUERIES = 16
"""Each query replays its workflow on a worker: a few at a time, so a store of thousands verifies in minutes."""


@dataclass
class Verification:
    events: int = 0
    breaks: list[ChainBreak] = field(default_factory=list)
    anchored: int = 0
    """Workflows whose trail was held against their own count."""
    unanchored: list[str] = field(default_factory=list)
    """Why some trails could not be held against Temporal (no worker answered, Temporal unreachable)."""


async def verify(
    store: Engine,
    key: AuditKey | None,
    client: Client | None,
    subjects: Iterable[str] | None = None,
    *,
    control_queue: str | None = None,
) -> Verification:
    """`control_queue`: only the workflows of the stack whose trails live in `store` (its workflows run on its
    control queue; another stack sharing the Temporal namespace keeps its trails in another store)."""
    wanted = set(subjects) if subjects is not None else None
    with session_scope(store) as session:
        events, breaks = chain.verify(session, wanted, key=key)
    result = Verification(events=events, breaks=breaks)
    if client is None:
        result.unanchored.append("Temporal was not asked (no client)")
        return result
    broken = {found.ticket_id for found in breaks}
    gate = asyncio.Semaphore(CONCURRENT_QUERIES)

    async def hold(execution: WorkflowExecution) -> None:
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        async with gate:
            try:
                head = await handle.query(AUDIT_HEAD_QUERY, result_type=TrailHead, rpc_timeout=QUERY_TIMEOUT)
            except (TimeoutError, RPCError) as error:
                result.unanchored.append(f"{execution.id} (run {execution.run_id[:12]}): {error}")
                return
        if (wanted is not None and head.subject not in wanted) or head.subject in broken:
            return
        found = await asyncio.to_thread(_held_to, store, head, execution.status)
        result.anchored += 1
        if found is not None and head.subject not in broken:
            result.breaks.append(found)
            broken.add(head.subject)

    try:
        executions = [execution async for execution in client.list_workflows(_listing(wanted, control_queue))]
    except RPCError as error:
        result.unanchored.append(f"Temporal did not list the workflows: {error.message}")
        return result
    await asyncio.gather(*(hold(execution) for execution in executions))
    return result


def _listing(subjects: set[str] | None, control_queue: str | None = None) -> str:
    """The visibility query for the workflows that keep the trails of `subjects` (all of them: None)."""
    kinds = " OR ".join(f"WorkflowType = '{name}'" for name in TRAIL_WORKFLOWS)
    if control_queue is not None:
        kinds = f"({kinds}) AND TaskQueue = {json.dumps(control_queue)}"
    if subjects is None:
        return kinds
    ids = sorted(_workflow_of(s) for s in subjects)
    return f"({kinds}) AND (" + " OR ".join(f"WorkflowId = {json.dumps(i)}" for i in ids) + ")"


def _workflow_of(subject: str) -> str:
    if subject.startswith(QUESTION_SUBJECT):  # a question's trail: `question:<id>`, workflow `question-<id>`
        return question_workflow_id(subject.removeprefix(QUESTION_SUBJECT))
    return subject if subject.startswith((TRAINING_PREFIX, CAMPAIGN_PREFIX)) else ticket_workflow_id(subject)


def _held_to(store: Engine, head: TrailHead, status: WorkflowExecutionStatus | None) -> ChainBreak | None:
    """The store's events of one workflow against the workflow's own count of them."""
    with session_scope(store) as session:
        stored = session.exec(
            select(func.max(AuditEventRow.seq)).where(AuditEventRow.run_id == head.run_id)
        ).first()
        closing = session.exec(
            select(AuditEventRow).where(
                AuditEventRow.run_id == head.run_id, AuditEventRow.seq == head.seq + 1
            )
        ).first()
    stored = stored or 0
    if stored < head.seq:
        what = "every event of it was deleted" if stored == 0 else f"the store holds only up to #{stored}"
        return ChainBreak(
            head.subject, BreakKind.TRUNCATED, None, head.run_id, head.seq,
            f"workflow {head.workflow_id} (run {head.run_id[:12]}) wrote events up to #{head.seq}, but {what}",
        )  # fmt: skip
    running = status is WorkflowExecutionStatus.RUNNING
    terminated_close = (
        status is WorkflowExecutionStatus.TERMINATED
        and stored == head.seq + 1
        and closing is not None
        and closing.kind == AuditKind.CLOSED.value
        and "terminated_run" in closing.detail
    )  # `daedalus ticket terminate` writes the closing event itself, after the workflow's last
    if stored > head.seq and not running and not terminated_close:
        return ChainBreak(
            head.subject, BreakKind.FORGED, None, head.run_id, head.seq + 1,
            f"the store holds events of workflow {head.workflow_id} (run {head.run_id[:12]}) up to #{stored}, "
            f"but the closed workflow wrote only up to #{head.seq}: events were appended",
        )  # fmt: skip
    return None
