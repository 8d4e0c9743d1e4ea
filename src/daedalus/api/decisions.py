"""/decisions: answer a pending decision request as the caller; list requests and answers from the store."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query
from temporalio.client import Client

from daedalus import services as tickets
from daedalus.api.context import Caller, Context, TemporalClient, require_same_person
from daedalus.api.errors import refusal, within
from daedalus.api.models import DecisionPublic
from daedalus.decisions.questions import QuestionStatus
from daedalus.decisions.schemas import Decision
from daedalus.errors import RequestRefused
from daedalus.ids import training_workflow_id
from daedalus.schemas.campaigns import CampaignStatus
from daedalus.schemas.ticket import TicketState, TicketStatus
from daedalus.schemas.training import TrainingRunStatus
from daedalus.services import questions
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.training import TrainingRunWorkflow

router = APIRouter(prefix="/decisions", tags=["decisions"])
POLL_S = 0.1


@router.post("", response_model=TicketState | TrainingRunStatus | CampaignStatus | QuestionStatus)
async def decide(
    decision: Decision, caller: Caller, context: Context, client: TemporalClient
) -> TicketState | TrainingRunStatus | CampaignStatus | QuestionStatus:
    """Answer a decision request (a ticket's, a training run's escalation, a campaign's proposal or a
    question for the deciders).

    `decided_by` must be the caller; the subject's workflow checks the request id, the option and the caller's
    authority before it writes anything (409 with its reason when it refuses). The answer is the subject's
    state after the decision is recorded."""
    require_same_person(caller, decision.decided_by, "decided_by")
    decision = decision.model_copy(update={"channel": "api"})
    timeout_s = context.settings.update_timeout_s
    try:
        accepted = await within(
            tickets.decide(client, decision, store=context.engine, policy=context.policy),
            timeout_s,
            decision.request_id,
        )
        return await within(state_after(client, decision, accepted), timeout_s, decision.request_id)
    except RequestRefused as error:
        raise refusal(error) from error


async def state_after(
    client: Client,
    decision: Decision,
    accepted: TicketState | TrainingRunStatus | CampaignStatus | QuestionStatus,
) -> TicketState | TrainingRunStatus | CampaignStatus | QuestionStatus:
    """The state once the decision is applied and recorded.

    The `decide` update answers as soon as the ticket accepts the decision, with the state from before it;
    the workflow then records it (an audit event) and moves on. A caller wants the state after the decision,
    so this polls the status query (which shows only what the trail holds) until the decision is recorded and
    the ticket has moved past the question: a new status (dispatched, closed...) or a new request.
    """
    if isinstance(accepted, CampaignStatus):
        return accepted  # a campaign closes on its proposal's answer; its status carries the adopted preset
    if isinstance(accepted, QuestionStatus):
        while True:  # a question closes on its answer: return it once the close is written
            question = await questions.status(client, accepted.question_id)
            if question.status.is_closed:
                return question
            await asyncio.sleep(POLL_S)
    if isinstance(accepted, TrainingRunStatus):
        handle = client.get_workflow_handle(training_workflow_id(accepted.name))
        while True:
            run: TrainingRunStatus = await handle.query(TrainingRunWorkflow.status)
            if run.pending_decision is None or run.pending_decision.id != decision.request_id:
                return run
            await asyncio.sleep(POLL_S)
    while True:
        state = await tickets.status(client, accepted.spec.id)
        recorded = any(d.request_id == decision.request_id for d in state.decisions)
        asking = state.status in (TicketStatus.AWAITING_APPROVAL, TicketStatus.AWAITING_DECISION)
        asked_again = state.pending_decision is not None and state.pending_decision.id != decision.request_id
        if recorded and (not asking or asked_again):
            return state
        await asyncio.sleep(POLL_S)


@router.get("", response_model=list[DecisionPublic])
async def list_decisions(
    _: Caller,
    context: Context,
    ticket: Annotated[str | None, Query(description="only this ticket's requests")] = None,
    pending: Annotated[bool, Query(description="only requests still waiting for an answer")] = False,
) -> list[DecisionPublic]:
    def read() -> list[DecisionPublic]:
        with session_scope(context.engine) as session:
            rows = queries.decisions(session=session, ticket_id=ticket, pending=pending)
            return [DecisionPublic.model_validate(row) for row in rows]

    return await asyncio.to_thread(read)
