"""The chaos bench's decider: every pending request answered through the HTTP API, each answer carrying its own
id in its note (so the checks can tell whether it was applied exactly once), retried on errors."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

DECIDER = "wayne"
NOTE_PREFIX = "chaos-decision "


@dataclass
class Sent:
    """One answer: its own id, what it answers, and every try's HTTP status (0: no connection)."""

    decision_id: str
    request_id: str
    ticket_id: str
    option: str
    posts: int = 0
    statuses: list[int] = field(default_factory=list)
    confirmed: bool = False

    @property
    def note(self) -> str:
        return NOTE_PREFIX + self.decision_id


class Decider:
    """Polls the pending requests (GET /decisions?pending=true) and answers each once, after a random delay,
    with the option `option(request)` names; an answer is sent again (same id) until it is seen applied."""

    def __init__(
        self, api: httpx.AsyncClient, option: Callable[[dict[str, Any]], str], rng: random.Random
    ) -> None:
        self.api = api
        self.option = option
        self.rng = rng
        self.sent: dict[str, Sent] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                response = await self.api.get("/decisions", params={"pending": "true"})
                if response.status_code == 200:
                    for request in response.json():
                        if request["request_id"] not in self.sent:
                            self._answer(request)
            await asyncio.sleep(0.5)
        await asyncio.gather(*self.tasks)

    def _answer(self, request: dict[str, Any]) -> None:
        sent = Sent(
            decision_id=uuid.uuid4().hex[:12],
            request_id=request["request_id"],
            ticket_id=request["ticket_id"],
            option=self.option(request),
        )
        self.sent[sent.request_id] = sent
        task = asyncio.create_task(self._send(sent, delay_s=self.rng.uniform(0, 3)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send(self, sent: Sent, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        body = {
            "request_id": sent.request_id,
            "option": sent.option,
            "decided_by": DECIDER,
            "note": sent.note,
        }
        while not sent.confirmed:
            try:
                sent.posts += 1
                response = await self.api.post("/decisions", json=body, timeout=60)
                sent.statuses.append(response.status_code)
                if response.status_code == 200:
                    sent.confirmed = True
                    return
            except httpx.HTTPError:
                sent.statuses.append(0)  # connection error: the same answer again
            # Refused (409: not waiting, perhaps because this very answer landed), or Temporal was away:
            # look in the store; resend only while the request still waits and nobody answered it.
            row = await self._row(sent)
            if row is not None and row["decided_at"] is not None:
                sent.confirmed = row["note"] == sent.note
                return
            await asyncio.sleep(1.0)

    async def _row(self, sent: Sent) -> dict[str, Any] | None:
        with contextlib.suppress(httpx.HTTPError):
            response = await self.api.get("/decisions", params={"ticket": sent.ticket_id})
            if response.status_code == 200:
                for row in response.json():
                    if row["request_id"] == sent.request_id:
                        return dict(row)
        return None
