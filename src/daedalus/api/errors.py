"""Refusals as HTTP: RequestRefused -> the status its cause calls for; validation -> field paths a person can read."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import structlog
from fastapi import HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from daedalus.errors import NotAllowed, RequestRefused
from daedalus.services import UnknownRequest

T = TypeVar("T")
log = structlog.get_logger(__name__)


def status_for(error: RequestRefused) -> int:
    """A RequestRefused's HTTP status, from what Temporal said underneath it."""
    if isinstance(error, UnknownRequest):
        return status.HTTP_404_NOT_FOUND
    if isinstance(error, NotAllowed):
        return status.HTTP_403_FORBIDDEN
    cause = error.__cause__
    if isinstance(cause, WorkflowAlreadyStartedError | WorkflowUpdateFailedError):
        return status.HTTP_409_CONFLICT  # a live duplicate, or the ticket's validator refused the change
    if isinstance(cause, RPCError):
        if cause.status is RPCStatusCode.NOT_FOUND:
            return status.HTTP_404_NOT_FOUND
        if cause.status is RPCStatusCode.RESOURCE_EXHAUSTED:
            return status.HTTP_413_CONTENT_TOO_LARGE  # a payload over Temporal's limits
        if cause.status is RPCStatusCode.INVALID_ARGUMENT:
            return status.HTTP_422_UNPROCESSABLE_CONTENT
        return status.HTTP_502_BAD_GATEWAY
    return status.HTTP_422_UNPROCESSABLE_CONTENT  # refused before reaching Temporal: a malformed id


def refusal(error: RequestRefused) -> HTTPException:
    """The refusal a caller reads. Temporal's own gRPC text stays in the API's log: it names internals (payload
    sizes, service names) and tells the caller nothing they can act on."""
    code = status_for(error)
    cause = error.__cause__
    if isinstance(cause, RPCError) and cause.status is not RPCStatusCode.NOT_FOUND:
        log.warning("temporal refused a request", status=cause.status.name, message=cause.message)
        if code == status.HTTP_413_CONTENT_TOO_LARGE:
            return HTTPException(
                code,
                "the request is too large for Temporal to carry; shorten the brief, note or spec "
                "(see `daedalus.schemas.limits`)",
            )
        if code == status.HTTP_422_UNPROCESSABLE_CONTENT:
            return HTTPException(code, f"Temporal refused the request as invalid ({cause.status.name})")
        return HTTPException(
            code, f"Temporal did not answer as expected ({cause.status.name}); the API's log has its reply"
        )
    return HTTPException(code, str(error))


async def within(awaitable: Awaitable[T], timeout_s: float, what: str) -> T:
    """Wait on Temporal for at most `timeout_s`; a request handler never waits on a stuck worker for long.

    An update cut short here surfaces as the SDK's `WorkflowUpdateRPCTimeoutOrCancelledError` (it turns the
    cancellation into its own error, which `wait_for` passes on instead of TimeoutError), as does an update
    whose own RPC timed out while Temporal restarted: both are "no answer yet", never a 500."""
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError) as error:
        raise HTTPException(
            status.HTTP_504_GATEWAY_TIMEOUT,
            f"{what}: no answer from the ticket within {timeout_s:g}s; is a control worker running "
            f"(`daedalus worker`)? The request may still be applied when one picks it up",
        ) from error


def explain_problems(problems: Sequence[Any], source: str) -> tuple[str, list[dict[str, str]]]:
    """Pydantic problems as `client.explain` writes them: one line per field path, with what was given."""
    lines = [f"{source} is not valid ({len(problems)} problem(s)):"]
    fields: list[dict[str, str]] = []
    for problem in problems:
        loc = [str(part) for part in problem.get("loc", ())]
        if loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        where = ".".join(loc) or "(top level)"
        given = problem.get("input")
        shown = "" if isinstance(given, dict | list) or given is None else f" (got {given!r})"
        lines.append(f"  - {where}: {problem.get('msg', 'invalid')}{shown}")
        fields.append({"field": where, "problem": str(problem.get("msg", "invalid"))})
    return "\n".join(lines), fields


async def validation_handler(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    detail, fields = explain_problems(error.errors(), f"{request.method} {request.url.path}")
    return JSONResponse(
        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content={"detail": detail, "problems": fields}
    )
