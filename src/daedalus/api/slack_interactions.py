"""POST /slack/interactions (the API side of Slack approvals): a decision button click. Verify the signature, answer Slack at once, then apply
the decision through the ticket's `decide` update and tell the clicker the outcome through the response_url."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

import structlog
from fastapi import APIRouter, BackgroundTasks, HTTPException, Request, Response, status
from slack_sdk.signature import SignatureVerifier
from temporalio.client import Client

from daedalus import services as tickets
from daedalus.api.context import ApiContext, Context
from daedalus.api.errors import within
from daedalus.errors import BadButton, RequestRefused
from daedalus.escaping import for_slack
from daedalus.schemas.ticket import Decision
from daedalus.slack.blocks import is_decision_action, parse_button_value
from daedalus.slack.notifier import answer_interaction

router = APIRouter(prefix="/slack", tags=["slack"])
log = structlog.get_logger(__name__)


@router.post("/interactions", status_code=status.HTTP_200_OK, response_class=Response)
async def interactions(request: Request, background: BackgroundTasks, context: Context) -> Response:
    """Slack's Interactivity Request URL. Answers within Slack's 3 s; the decision is applied right after."""
    if context.slack.signing_secret is None:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "Slack is not configured here (set DAEDALUS_SLACK_SIGNING_SECRET)",
        )
    body = await request.body()
    verifier = SignatureVerifier(context.slack.signing_secret.get_secret_value())
    try:
        valid = verifier.is_valid_request(body, dict(request.headers))
    except ValueError:  # a timestamp header that is not a number
        valid = False
    if not valid:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "bad or stale Slack signature")

    payload = _payload(body)
    action = next(
        (a for a in payload.get("actions", []) if is_decision_action(str(a.get("action_id", "")))), None
    )
    if payload.get("type") != "block_actions" or action is None:
        return Response(status_code=status.HTTP_200_OK)  # not ours to handle: acknowledge and ignore
    response_url = str(payload.get("response_url", ""))
    slack_user = str(payload.get("user", {}).get("id", ""))
    person = context.slack.users.get(slack_user)
    if person is None:
        log.warning("slack click from an unlinked user", slack_user=slack_user)
        background.add_task(
            _answer,
            response_url,
            f"Refused: Slack user {for_slack(slack_user)} is not linked to a Daedalus person; ask an admin to add it "
            f"to DAEDALUS_SLACK_USERS. Nothing was decided.",
            False,
        )
        return Response(status_code=status.HTTP_200_OK)
    try:
        choice = parse_button_value(str(action.get("value", "")))
        decision = Decision(
            request_id=choice.request_id, option=choice.option, decided_by=person, channel="slack"
        )
    except (BadButton, ValueError) as error:
        background.add_task(
            _answer, response_url, f"Refused: {for_slack(error)}. Nothing was decided.", False
        )
        return Response(status_code=status.HTTP_200_OK)
    question = str(payload.get("message", {}).get("text", ""))
    background.add_task(_decide_and_answer, context, decision, response_url, question)
    return Response(status_code=status.HTTP_200_OK)


def _payload(body: bytes) -> dict[str, Any]:
    try:
        form = parse_qs(body.decode(), strict_parsing=False)
        payload = json.loads(form["payload"][0])
    except (UnicodeDecodeError, KeyError, IndexError, ValueError) as error:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, "expected a form field `payload` holding Slack's JSON"
        ) from error
    if not isinstance(payload, dict):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "Slack's payload must be a JSON object")
    return payload


async def _decide_and_answer(
    context: ApiContext, decision: Decision, response_url: str, question: str
) -> None:
    """Runs after Slack got its 200: apply the decision, then replace the buttons or explain the refusal."""
    timeout_s = context.settings.update_timeout_s
    try:
        client: Client = await context.client()
        await within(
            tickets.decide(client, decision, store=context.engine, policy=context.policy),
            timeout_s,
            decision.request_id,
        )
    except RequestRefused as error:
        await _answer(response_url, f"Refused: {for_slack(error)}. Nothing was decided.", False)
        return
    except HTTPException as error:
        if error.status_code == status.HTTP_504_GATEWAY_TIMEOUT:  # `within` gave up waiting on the ticket
            text = (
                f"No answer from ticket {decision.request_id} within {timeout_s:g}s; "
                f"it may still apply. Check with `daedalus ticket show`."
            )
        else:  # Temporal unreachable
            text = f"Not applied: {for_slack(error.detail)}"
        await _answer(response_url, text, False)
        return
    log.info(
        "slack decision applied", request=decision.request_id, by=decision.decided_by, option=decision.option
    )
    head = f"{question}\n" if question else ""
    await _answer(
        response_url,
        f"{head}*{decision.decided_by}* chose *{decision.option}* for `{decision.request_id}`.",
        True,
    )


async def _answer(response_url: str, text: str, replace_original: bool) -> None:
    if not response_url:
        return
    try:
        await asyncio.to_thread(answer_interaction, response_url, text, replace_original=replace_original)
    except OSError as error:  # the decision stands even if Slack cannot be told
        log.warning("cannot answer slack interaction", error=str(error))
