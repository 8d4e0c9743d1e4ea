"""A decision request quoting a hostile title reaches Slack (the local fake, through the real slack_sdk client)
with `&`, `<` and `>` escaped: no `@channel`, no link that shows one address and opens another."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from pydantic import SecretStr
from temporalio.testing import ActivityEnvironment

from daedalus.activities.notify import NotifyActivities
from daedalus.schemas.notify import NotifyOutcome
from daedalus.schemas.ticket import DecisionKind, DecisionRequest
from daedalus.slack.blocks import SECTION_LIMIT, decision_blocks
from daedalus.slack.settings import SlackSettings
from tests.slack.fake_slack import FakeSlack, running_fake_slack

TITLE = "<!channel> urgent & <https://evil.example/login|https://sso.example.com> \x1b[2J"


def hostile_request() -> DecisionRequest:
    return DecisionRequest(
        id="t9-dispatch-1",
        ticket_id="t9",
        kind=DecisionKind.DISPATCH,
        question=f"Dispatch ticket t9 ({TITLE}) to scripted on h1?",
        options=["approve", "reject"],
        evidence=[f"spec: {TITLE}", "<@U0WAYNE> <!here>"],
        deciders=["wayne"],
        requested_at=datetime(2026, 11, 30, tzinfo=UTC),
    )


async def test_a_hostile_title_is_posted_as_text(tmp_path: Path) -> None:
    with running_fake_slack() as slack:
        slack_: FakeSlack = slack
        settings = SlackSettings(
            bot_token=SecretStr(slack_.token), channel=slack_.channels[0], base_url=slack_.base_url
        )
        activities = NotifyActivities(settings, tmp_path / "ledger")
        result = await ActivityEnvironment().run(activities.notify_decision_request, hostile_request())
        assert result.outcome is NotifyOutcome.POSTED, result.detail
        [post] = slack_.posts
    everything = post["text"] + json.dumps(post["blocks"], ensure_ascii=False)
    for raw in ("<!channel>", "<!here>", "<@U0WAYNE>", "<https://evil.example", "\x1b"):
        assert raw not in everything, raw
    assert (
        "&lt;!channel&gt; urgent &amp; &lt;https://evil.example/login|https://sso.example.com&gt;"
        in post["text"]
    )
    assert "&lt;@U0WAYNE&gt; &lt;!here&gt;" in json.dumps(post["blocks"])
    assert "\\x1b[2J" in post["text"]


def test_clipping_never_cuts_an_escape_in_half() -> None:
    request = hostile_request().model_copy(update={"question": "x" * (SECTION_LIMIT - 3) + "<<<<"})
    section = decision_blocks(request)[0].to_dict()["text"]["text"]
    assert len(section) <= SECTION_LIMIT and section.endswith("x…")
