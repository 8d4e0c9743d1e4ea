"""A host's check of itself before it takes work (daedalus.hosts.check), as the lease keeper keeps it and
`daedalus hosts` shows it. Pydantic only: safe inside workflows."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field, model_validator

from daedalus.schemas._base import Model


class CheckStatus(StrEnum):
    OK = "ok"
    WARN = "warn"
    """The host can work, but something is off (the line says what it costs)."""
    FAIL = "fail"
    """The host cannot do its job: its worker does not poll the queue until this is fixed."""
    SKIP = "skip"
    """Does not apply to this host (no GPUs declared)."""


class CheckLine(Model):
    name: str = Field(min_length=1, max_length=40)
    status: CheckStatus
    detail: str = Field(default="", max_length=2000)
    fix: str = Field(default="", max_length=1000, description="what to do about it; every failure has one")

    @model_validator(mode="after")
    def _failure_names_its_fix(self) -> CheckLine:
        if self.status is CheckStatus.FAIL and not self.fix:
            raise ValueError(f"check {self.name} failed without saying how to fix it")
        return self


class HostCheck(Model):
    host: str
    checked_at: datetime = Field(description="the host's own clock when it sent the check")
    checked_by: str = Field(default="", description="the worker's identity (user@machine pid)")
    lines: list[CheckLine] = Field(default_factory=list, max_length=40)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[CheckLine]:
        return [line for line in self.lines if line.status is CheckStatus.FAIL]

    def summary(self) -> str:
        counts = {status: sum(1 for line in self.lines if line.status is status) for status in CheckStatus}
        shown = ", ".join(f"{n} {status.value}" for status, n in counts.items() if n)
        return f"{'ok' if self.ok else 'FAILED'} ({shown})"


class HostCheckRecord(Model):
    """The last check the keeper was sent, with its own clock when it got it."""

    check: HostCheck
    received_at: datetime


class HostCheckReceipt(Model):
    """The keeper's answer: its clock (Temporal's, as `workflow.now()` reads it) when it took the check."""

    received_at: datetime
