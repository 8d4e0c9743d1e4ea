"""API settings (DAEDALUS_API_*): who a bearer token is, and how long a request may wait on Temporal."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from daedalus.schemas.ticket import PERSON_PATTERN


class ApiSettings(BaseModel):
    """The `api` section of daedalus.config.Settings (DAEDALUS_API_*)."""

    model_config = ConfigDict(extra="forbid")

    tokens: dict[str, str] = Field(
        default_factory=dict, description='bearer token -> Daedalus person, e.g. {"s3cret": "wayne"}'
    )
    update_timeout_s: float = Field(
        default=15, gt=0, description="how long a request waits for the ticket to accept or refuse a change"
    )

    @field_validator("tokens")
    @classmethod
    def _people(cls, tokens: dict[str, str]) -> dict[str, str]:
        people = {token: person.lower() for token, person in tokens.items()}
        bad = sorted(p for p in people.values() if not re.match(PERSON_PATTERN, p))
        if bad:
            raise ValueError(f"DAEDALUS_API_TOKENS maps to names that are not Daedalus people: {bad}")
        if any(not token.strip() for token in people):
            raise ValueError("DAEDALUS_API_TOKENS has an empty token")
        return people
