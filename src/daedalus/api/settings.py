"""API settings (DAEDALUS_API_*): how long a request may wait on Temporal, and where the CLI finds a shared
stack's API with which token. Tokens themselves live hashed in the store (store/tokens.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

LEGACY_TOKENS_MESSAGE = (
    "DAEDALUS_API_TOKENS (a plaintext token map) is no longer read: API tokens are now stored hashed in the "
    "store. To convert: for each person in the old map run `daedalus token create --person <person>` (with "
    "DAEDALUS_DATABASE_URL pointing at the stack's store) and hand them the printed token; then remove "
    "DAEDALUS_API_TOKENS from the environment and .env. The old tokens stop working."
)


class ApiSettings(BaseModel):
    """The `api` section of daedalus.config.Settings (DAEDALUS_API_*)."""

    model_config = ConfigDict(extra="forbid")

    update_timeout_s: float = Field(
        default=15, gt=0, description="how long a request waits for the ticket to accept or refuse a change"
    )
    url: str | None = Field(
        default=None,
        description="for the CLI: a shared stack's API, e.g. https://daedalus.example:8000; when set, ticket "
        "commands go through it with `token` instead of to Temporal and the store directly",
    )
    token: SecretStr | None = Field(
        default=None, description="for the CLI: your API token (dtk_..., from `daedalus token create`)"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_plaintext_tokens(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("tokens") not in (None, "", "{}", {}):
            raise ValueError(LEGACY_TOKENS_MESSAGE)
        if isinstance(values, dict):
            values = {k: v for k, v in values.items() if k != "tokens"}  # an empty old map is harmless
        return values

    @field_validator("url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        if not url:
            return None
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://, e.g. http://127.0.0.1:8000")
        return url.rstrip("/")
