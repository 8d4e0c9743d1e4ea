"""Block Kit for a DecisionRequest: the question, its evidence, and one button per option."""

from __future__ import annotations

import json

from pydantic import ValidationError
from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ContextBlock,
    MarkdownTextObject,
    SectionBlock,
)

from daedalus.errors import BadButton
from daedalus.escaping import for_slack, plain
from daedalus.schemas.ticket import DecisionKind, DecisionRequest
from daedalus.slack.models import ButtonValue

ACTION_PREFIX = "decide"
"""Every decision button's action_id starts with this. Slack refuses two equal action_ids in one block, so
each button's id is `decide:<option>`; the click handler matches the prefix."""

SECTION_LIMIT = 3000
STYLES = {"approve": "primary", "reject": "danger", "fail": "danger", "accept": "primary"}


def action_id(option: str) -> str:
    return f"{ACTION_PREFIX}:{option}"


def is_decision_action(action_id_: str) -> bool:
    return action_id_ == ACTION_PREFIX or action_id_.startswith(f"{ACTION_PREFIX}:")


def button_value(request_id: str, option: str) -> str:
    return ButtonValue(request_id=request_id, option=option).model_dump_json()


def parse_button_value(value: str) -> ButtonValue:
    try:
        return ButtonValue.model_validate(json.loads(value))
    except (ValueError, ValidationError) as error:
        raise BadButton(f"this button does not carry a Daedalus decision ({value[:80]!r})") from error


def fallback_text(request: DecisionRequest) -> str:
    """The plain text Slack shows in notifications and to clients without Block Kit (mrkdwn as well)."""
    prefix = f"Reminder {request.reminders_sent}: " if request.reminders_sent else ""
    return for_slack(
        f"{prefix}{request.question} (decision {request.id}; options: {', '.join(request.options)})"
    )


def decision_blocks(request: DecisionRequest) -> list[Block]:
    # Every text below is escaped: a question quotes the ticket's title, and a title that says `<!channel>`
    # or `<https://evil|https://good>` must reach Slack as those characters, not as a mention or a link.
    who = for_slack(", ".join(request.allowed))
    heading = f"*Reminder {request.reminders_sent}* — " if request.reminders_sent else ""
    if request.kind is DecisionKind.QUESTION:  # a question that belongs to no ticket says so
        heading += "*Question for the deciders* — "
    blocks: list[Block] = [
        SectionBlock(
            block_id=f"question:{request.id}",
            text=MarkdownTextObject(text=_clip(f"{heading}{for_slack(request.question)}")),
        )
    ]
    if request.evidence:
        evidence = "\n".join(f"• {for_slack(line)}" for line in request.evidence)
        blocks.append(
            SectionBlock(block_id=f"evidence:{request.id}", text=MarkdownTextObject(text=_clip(evidence)))
        )
    blocks.append(
        ContextBlock(
            block_id=f"who:{request.id}",
            elements=[
                MarkdownTextObject(text=_clip(f"decision `{for_slack(request.id)}` · may decide: {who}"))
            ],
        )
    )
    blocks.append(
        ActionsBlock(
            block_id=f"decide:{request.id}",
            elements=[
                ButtonElement(
                    text=plain(option)[:75],
                    action_id=action_id(option),
                    value=button_value(request.id, option),
                    style=STYLES.get(option),
                )
                for option in request.options
            ],
        )
    )
    return blocks


def _clip(text: str) -> str:
    if len(text) <= SECTION_LIMIT:
        return text
    clipped = text[: SECTION_LIMIT - 1]
    # never cut an escape (`&amp;`) in half: Slack would show the rest of it raw
    entity = clipped.rfind("&")
    if entity != -1 and ";" not in clipped[entity:]:
        clipped = clipped[:entity]
    return clipped + "…"
