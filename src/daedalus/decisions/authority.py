"""Who may answer a decision request: one function, run by every workflow's `decide` validator.

The server-side policy (who may make a host run anything, who may approve spend) plugs in as an
`AuthorityPolicy`: the service layer runs it before the update is sent, and the workflow's validator runs the
request's own rules, so a refusal from either comes back before anything is written.
"""

from __future__ import annotations

from typing import Protocol

from daedalus.decisions.schemas import Decision, DecisionRequest


class AuthorityPolicy(Protocol):
    """A rule beyond the request's own deciders and delegates; returns why it refuses, or None."""

    def __call__(self, request: DecisionRequest, decision: Decision, /) -> str | None: ...


def refusal(
    request: DecisionRequest,
    decision: Decision,
    policy: AuthorityPolicy | None = None,
    *,
    label: str | None = None,
) -> str | None:
    """Why `decision` cannot answer `request` (the message the caller sees), or None when it can. `label`
    names the subject for a request made without one."""
    if decision.request_id != request.id:
        return f"unknown decision request {decision.request_id!r}; the pending one is {request.id!r}"
    if decision.option not in request.options:
        return f"unknown option {decision.option!r} for {request.id}; choose one of {request.options}"
    allowed = request.allowed
    if decision.decided_by.lower() in request.excluded:
        return (
            f"{decision.decided_by} filed {label or request.subject_label} and may not decide its "
            f"{request.kind.value}; ask someone else with authority: {allowed}"
        )
    if decision.decided_by.lower() not in allowed:
        return (
            f"{decision.decided_by} may not decide {request.kind.value} for {label or request.subject_label}; "
            f"allowed: {allowed}"
        )
    return policy(request, decision) if policy is not None else None
