"""Decisions: answer a pending request of any subject (ticket, training run, campaign) through its `decide` update.

A decision finds its workflow by the request's subject, never by parsing the request id: a caller that holds
the request passes its subject; otherwise the store says which subject asked it (the desk records the subject
in the request's audit event, which is written before anyone can see the request). A server-side
`AuthorityPolicy` (who may decide what, beyond the request's deciders) is checked here, before the update.
"""

from __future__ import annotations

import asyncio
from typing import assert_never

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.decisions.authority import AuthorityPolicy, refusal
from daedalus.decisions.questions import QuestionStatus
from daedalus.decisions.schemas import (
    CampaignSubject,
    Decision,
    DecisionSubject,
    QuestionSubject,
    TicketSubject,
    TrainingRunSubject,
)
from daedalus.errors import NotAllowed
from daedalus.schemas.campaigns import CampaignStatus
from daedalus.schemas.ticket import TicketState
from daedalus.schemas.training import TrainingRunStatus
from daedalus.services._temporal import (
    CampaignRefused,
    RequestRefused,
    TrainingRefused,
    UnknownRequest,
    update,
)
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.campaign import CampaignWorkflow
from daedalus.workflows.question import QuestionWorkflow
from daedalus.workflows.ticket import TicketWorkflow
from daedalus.workflows.training import TrainingRunWorkflow

SUBJECT: TypeAdapter[DecisionSubject] = TypeAdapter(DecisionSubject)


async def subject_of(request_id: str, *, store: Engine) -> DecisionSubject:
    """Which subject asked `request_id`, from the store; an UnknownRequest when nobody did."""

    def read() -> str | None:
        with session_scope(store) as session:
            return queries.decision_subject(session=session, request_id=request_id)

    found = await asyncio.to_thread(read)
    if found is None:
        raise UnknownRequest(
            f"unknown decision request {request_id!r}: no ticket, training run, campaign or question asked it; "
            f"`daedalus ticket show ID` or `GET /decisions?pending=true` lists the pending ones"
        )
    try:
        return SUBJECT.validate_json(found)
    except ValidationError as error:
        raise RequestRefused(
            f"decision request {request_id!r} names a subject this version does not know"
        ) from error


async def decide(
    client: Client,
    decision: Decision,
    *,
    subject: DecisionSubject | None = None,
    store: Engine | None = None,
    policy: AuthorityPolicy | None = None,
) -> TicketState | TrainingRunStatus | CampaignStatus | QuestionStatus:
    """Answer a pending decision through its subject's `decide` update, whose validator checks the request
    id, the option and the decider's authority before anything is written."""
    if subject is None:
        if store is None:
            raise RequestRefused(
                f"cannot tell whose decision {decision.request_id!r} is: no store to look it up in"
            )
        subject = await subject_of(decision.request_id, store=store)
    if policy is not None:
        await _check_policy(client, decision, subject, policy)
    match subject:
        case TicketSubject():
            state: TicketState = await update(
                client, subject.workflow_id, subject.label, TicketWorkflow.decide, decision
            )
            return state
        case TrainingRunSubject():
            status: TrainingRunStatus = await update(
                client,
                subject.workflow_id,
                subject.label,
                TrainingRunWorkflow.decide,
                decision,
                refused=TrainingRefused,
            )
            return status
        case CampaignSubject():
            campaign: CampaignStatus = await update(
                client,
                subject.workflow_id,
                subject.label,
                CampaignWorkflow.decide,
                decision,
                refused=CampaignRefused,
            )
            return campaign
        case QuestionSubject():
            question: QuestionStatus = await update(
                client, subject.workflow_id, subject.label, QuestionWorkflow.decide, decision
            )
            return question
        case _:
            assert_never(subject)


async def _check_policy(
    client: Client, decision: Decision, subject: DecisionSubject, policy: AuthorityPolicy
) -> None:
    """The server's rule, against the request as its workflow holds it now."""
    handle = client.get_workflow_handle(subject.workflow_id)
    match subject:
        case TicketSubject():
            request = (await handle.query(TicketWorkflow.state)).pending_decision
        case TrainingRunSubject():
            request = (await handle.query(TrainingRunWorkflow.status)).pending_decision
        case CampaignSubject():
            request = await handle.query(CampaignWorkflow.pending_decision)
        case QuestionSubject():
            request = await handle.query(QuestionWorkflow.pending_decision)
        case _:
            assert_never(subject)
    why = refusal(request, decision, policy) if request is not None else None
    if why is not None:
        raise NotAllowed(f"{subject.label} refused: {why}")
