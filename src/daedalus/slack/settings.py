"""Slack settings (DAEDALUS_SLACK_*): the bot that posts, the secret that signs clicks, who is who."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from daedalus.schemas.ticket import PERSON_PATTERN

SLACK_API = "https://slack.com/api/"


class SlackSettings(BaseModel):
    """The `slack` section of daedalus.config.Settings (DAEDALUS_SLACK_*)."""

    model_config = ConfigDict(extra="forbid")

    bot_token: SecretStr | None = Field(default=None, description="xoxb-...; unset = notifications are off")
    channel: str | None = Field(default=None, description="channel id (C...) where decision requests go")
    base_url: str = Field(default=SLACK_API, description="Slack Web API base URL (tests point it at a fake)")
    signing_secret: SecretStr | None = Field(default=None, description="verifies POST /slack/interactions")
    users: dict[str, str] = Field(
        default_factory=dict, description='Slack user id -> Daedalus person, e.g. {"U123": "wayne"}'
    )

    @field_validator("users")
    @classmethod
    def _people(cls, users: dict[str, str]) -> dict[str, str]:
        people = {slack_id: person.lower() for slack_id, person in users.items()}
        bad = sorted(p for p in people.values() if not re.match(PERSON_PATTERN, p))
        if bad:
            raise ValueError(f"DAEDALUS_SLACK_USERS maps to names that are not Daedalus people: {bad}")
        return people

    @property
    def posting(self) -> bool:
        """Whether decision requests can be posted at all."""
        return self.bot_token is not None and bool(self.channel)
