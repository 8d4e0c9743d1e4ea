"""Values the Slack adapter passes around. Pydantic only, so a workflow may import them."""

from __future__ import annotations

from pydantic import Field

from daedalus.schemas._base import Model


class PostedMessage(Model):
    channel: str
    ts: str


class ButtonValue(Model):
    """The `value` of a decision button: which request, which option."""

    request_id: str = Field(min_length=1)
    option: str = Field(min_length=1)
