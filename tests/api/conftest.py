"""An API app over the session's Temporal dev server and a per-test store, plus a local fake Slack."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.api import create_app
from daedalus.api.settings import ApiSettings
from daedalus.slack.settings import SlackSettings
from daedalus.store import tokens
from daedalus.store.database import make_engine, migrate
from tests.slack.fake_slack import FakeSlack, running_fake_slack

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TOKENS = {
    f"dtk_0000000{n}_{(person * 11)[:43]}": person for n, person in enumerate(("wayne", "mallory", "lead"), 1)
}
"""Well-formed API tokens; `install_tokens` stores their hashes in a test's store."""
SLACK_USERS = {"UWAYNE": "wayne", "UMALLORY": "mallory"}


def install_tokens(engine: Engine) -> None:
    for token, person in TOKENS.items():
        tokens.add(engine, person, token, created_by="tests")


def install_tokens_under(home: Path) -> None:
    """The tokens, in the store a `daedalus` process with DAEDALUS_HOME=home will open."""
    engine = make_engine(f"sqlite:///{home / 'daedalus.db'}")
    try:
        migrate(engine)
        install_tokens(engine)
    finally:
        engine.dispose()


def as_(person: str) -> dict[str, str]:
    [token] = [t for t, p in TOKENS.items() if p == person]
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with running_fake_slack() as fake:
        yield fake


@pytest.fixture
def slack_settings(slack: FakeSlack) -> SlackSettings:
    return SlackSettings(
        bot_token=SecretStr(slack.token),
        channel=slack.channels[0],
        base_url=slack.base_url,
        signing_secret=SecretStr(SIGNING_SECRET),
        users=SLACK_USERS,
    )


@pytest.fixture
async def api(
    temporal_client: Client, sqlite_engine: Engine, task_queue: str, slack_settings: SlackSettings
) -> AsyncIterator[httpx.AsyncClient]:
    install_tokens(sqlite_engine)
    app = create_app(
        client=temporal_client,
        engine=sqlite_engine,
        control_queue=task_queue,
        settings=ApiSettings(update_timeout_s=10),
        slack=slack_settings,
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://daedalus"
    ) as client:
        yield client
