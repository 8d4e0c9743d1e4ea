"""/questions and /rulings: ask the deciders a question that belongs to no ticket, read the questions, withdraw
one, and list the standing rulings. A question is answered like any decision: `POST /decisions`."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Query, status

from daedalus.api.context import Caller, Context, TemporalClient, require_same_person
from daedalus.api.errors import refusal, within
from daedalus.api.models import QuestionAsked, QuestionPublic
from daedalus.decisions.questions import QuestionSpec, QuestionStatus, WithdrawQuestion
from daedalus.decisions.rulings import Ruling
from daedalus.errors import RequestRefused
from daedalus.schemas.limits import SLUG_PATTERN
from daedalus.services import questions
from daedalus.store.database import session_scope

router = APIRouter(tags=["questions"])
QuestionId = Annotated[str, Path(pattern=SLUG_PATTERN, description="a question id, e.g. `dense-models`")]


@router.post("/questions", status_code=status.HTTP_201_CREATED, response_model=QuestionAsked)
async def ask(spec: QuestionSpec, caller: Caller, context: Context, client: TemporalClient) -> QuestionAsked:
    """Ask the deciders a question that belongs to no ticket (the body is a question, as in a YAML file of
    examples/questions/). The caller is the asker. 409 for an id asked before or a deadline that passed; 403 when
    the policy does not know the caller or the deciders named."""
    try:
        deciders = questions.resolve_deciders(spec, caller, context.policy)
        handle = await within(
            questions.ask(
                client,
                spec,
                queue=context.control_queue,
                asked_by=caller,
                policy=context.policy,
                store=context.engine,
            ),
            context.settings.update_timeout_s,
            f"question {spec.id}",
        )
    except RequestRefused as error:
        raise refusal(error) from error
    return QuestionAsked(question_id=spec.id, workflow_id=handle.id, asked_by=caller, deciders=deciders)


@router.get("/questions", response_model=list[QuestionPublic])
async def list_questions(
    _: Caller,
    context: Context,
    pending: Annotated[bool, Query(description="only questions still waiting for an answer")] = False,
) -> list[QuestionPublic]:
    def read() -> list[QuestionPublic]:
        with session_scope(context.engine) as session:
            return [QuestionPublic.from_row(row) for row in questions.question_rows(session, pending=pending)]

    return await asyncio.to_thread(read)


@router.get("/questions/{question_id}", response_model=QuestionStatus)
async def show(
    question_id: QuestionId, _: Caller, context: Context, client: TemporalClient
) -> QuestionStatus:
    """The question's state, with its pending request (answer it with `POST /decisions`)."""
    try:
        return await within(
            questions.status(client, question_id), context.settings.update_timeout_s, question_id
        )
    except RequestRefused as error:
        raise refusal(error) from error


@router.post("/questions/{question_id}/withdraw", response_model=QuestionStatus)
async def withdraw(
    question_id: QuestionId,
    request: WithdrawQuestion,
    caller: Caller,
    context: Context,
    client: TemporalClient,
) -> QuestionStatus:
    """Withdraw an open question (its asker or a decider); `requested_by` must be the caller."""
    require_same_person(caller, request.requested_by, "requested_by")
    try:
        return await within(
            questions.withdraw(client, question_id, request), context.settings.update_timeout_s, question_id
        )
    except RequestRefused as error:
        raise refusal(error) from error


@router.get("/rulings", response_model=list[Ruling])
async def rulings(_: Caller, context: Context) -> list[Ruling]:
    """The standing rulings, oldest first: each with its rule, who ruled and when."""
    return await asyncio.to_thread(questions.read_rulings, context.engine)
