"""Inputs and outputs of the scheduled report digest (a short Slack summary with a link to the full report)."""

from __future__ import annotations

from pydantic import Field

from daedalus.schemas._base import Model
from daedalus.schemas.notify import NotifyResult


class DigestInput(Model):
    window_hours: float = Field(default=24.0, gt=0, le=24 * 366)
    link: str = Field(
        default="", max_length=2000, description="where the full report is read, e.g. https://daedalus/report"
    )


class DigestResult(Model):
    summary: str
    html_path: str = Field(description="the HTML report written for this digest, in the artifact store")
    notify: NotifyResult
