"""/console: the decider's console, server-rendered. Sign in with an API token; see what waits for you with its
evidence; decide, delegate, cancel; read a ticket's trail and the report.

Every action calls the service layer as the CLI and the API do (`daedalus.services`, with the server's policy),
so the same authority checks run and the same audit events are written; the console adds no rule of its own. A
refusal comes back as the page with its reason; a form without the session's CSRF token is refused with 403.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import ValidationError
from sqlalchemy import func
from sqlmodel import select

from daedalus import services
from daedalus.api.console import views
from daedalus.api.console.session import (
    COOKIE_PATH,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    ConsoleSession,
    Refused,
    Sessions,
    csrf_matches,
)
from daedalus.api.context import ApiContext, get_context
from daedalus.api.decisions import state_after
from daedalus.api.errors import explain_problems, within
from daedalus.api.report import report_response
from daedalus.decisions.schemas import Channel, Decision, DecisionKind
from daedalus.errors import RequestRefused
from daedalus.schemas.ticket import TICKET_ID_PATTERN, CancelRequest, Delegation, TicketState
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.store.tables import AuditEventRow

HERE = Path(__file__).parent
STATIC = {
    "console.css": ("text/css; charset=utf-8", HERE / "static" / "console.css"),
    "console.js": ("text/javascript; charset=utf-8", HERE / "static" / "console.js"),
}
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
FORM_BYTES = 64 * 1024
"""A console form is a few fields; the API's body limit stops anything larger before it is read whole."""

router = APIRouter(prefix="/console", include_in_schema=False)
templates = Environment(
    loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True), auto_reload=False
)
templates.globals.update(fmt_time=views.fmt_time, side_by_side=views.side_by_side)


# ---- plumbing ----------------------------------------------------------------------------------------------


def sessions(request: Request) -> Sessions:
    """The console's sessions, made on first use over the API's store."""
    found: Sessions | None = getattr(request.app.state, "console_sessions", None)
    if found is None:
        found = Sessions(get_context(request).engine)
        request.app.state.console_sessions = found
    return found


def page(request: Request, template: str, code: int = 200, **values: Any) -> HTMLResponse:
    html = templates.get_template(template).render(request=request, **values)
    return HTMLResponse(html, status_code=code, headers=SECURITY_HEADERS)


def refused_page(
    request: Request, code: int, message: str, session: ConsoleSession | None = None
) -> HTMLResponse:
    return page(request, "error.html", code, message=message, session=session, flash=[])


def to_sign_in(request: Request, why: str | None = None) -> Response:
    if request.method == "GET":
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/console/login?next={_quoted(target)}", status.HTTP_303_SEE_OTHER)
    return refused_page(request, status.HTTP_401_UNAUTHORIZED, why or "sign in with your API token first")


def _quoted(path: str) -> str:
    from urllib.parse import quote

    return quote(path, safe="/")


def safe_next(target: str | None) -> str:
    """Only a path of this console: a sign-in link cannot send the browser anywhere else."""
    if not target:
        return "/console"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/console") or "//" in parts.path:
        return "/console"
    return target


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form, each field once; anything else is refused with what the console expects."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            f"the console takes its own forms (application/x-www-form-urlencoded), not {kind or 'no body'}; "
            f"scripts use the JSON API",
        )
    body = await request.body()
    if len(body) > FORM_BYTES:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, "the form is too large")
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False, max_num_fields=50)
    except (UnicodeDecodeError, ValueError) as error:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"the form could not be read: {error}") from error
    return {name: values[-1] for name, values in fields.items()}


def same_origin(request: Request) -> bool:
    """A browser names the page a POST came from; one from another site is refused (SameSite=Strict already
    keeps the session cookie from it: this is the second lock)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


class Action:
    """A signed-in POST: the session, its form, and its CSRF token checked."""

    def __init__(self, session: ConsoleSession, fields: dict[str, str]) -> None:
        self.session = session
        self.fields = fields

    def text(self, name: str) -> str:
        return self.fields.get(name, "").strip()


async def action(request: Request) -> Action | Response:
    try:
        session = sessions(request).current(request.cookies.get(SESSION_COOKIE))
    except Refused as why:
        return to_sign_in(request, str(why))
    if not same_origin(request):
        return refused_page(
            request, status.HTTP_403_FORBIDDEN, "refused: this form was sent from another site"
        )
    try:
        fields = await read_form(request)
    except HTTPException as error:
        return refused_page(request, error.status_code, str(error.detail), session)
    if not csrf_matches(session.csrf, fields.get("csrf")):
        return refused_page(
            request,
            status.HTTP_403_FORBIDDEN,
            "refused: the form's CSRF token is missing or does not belong to your session; reload the page and "
            "try again",
            session,
        )
    return Action(session, fields)


def flash(session: ConsoleSession, level: str, message: str) -> None:
    session.flash.append((level, message))


def back(action_: Action, default: str) -> RedirectResponse:
    return RedirectResponse(safe_next(action_.fields.get("back") or default), status.HTTP_303_SEE_OTHER)


def problems(error: ValidationError, what: str) -> str:
    detail, _ = explain_problems(error.errors(), what)
    return detail


def refusal_text(error: Exception) -> str:
    if isinstance(error, HTTPException):
        return str(error.detail)
    return str(error)


def latest_change(context: ApiContext) -> str:
    """Changes when anything is recorded: the newest audit event's id (decisions and closings are events)."""
    with session_scope(context.engine) as session:
        newest = session.exec(select(func.max(AuditEventRow.id))).one()
    return str(newest or 0)


# ---- signing in and out --------------------------------------------------------------------------------


@router.get("/login")
async def login_form(request: Request, next: str | None = None) -> Response:
    marker = secrets.token_urlsafe(32)
    response = page(
        request, "login.html", login_csrf=marker, next=safe_next(next), message=None, session=None
    )
    _set_cookie(request, response, LOGIN_COOKIE, marker, max_age=3600)
    return response


@router.post("/login")
async def login(request: Request) -> Response:
    try:
        fields = await read_form(request)
    except HTTPException as error:
        return refused_page(request, error.status_code, str(error.detail))
    marker = request.cookies.get(LOGIN_COOKIE)
    if not same_origin(request) or marker is None or not csrf_matches(marker, fields.get("login_csrf")):
        return refused_page(
            request,
            status.HTTP_403_FORBIDDEN,
            "refused: the sign-in form's CSRF token is missing or does not match; open /console/login and sign in "
            "from there",
        )
    token = fields.get("token", "").strip()
    target = safe_next(fields.get("next"))
    if not token:
        why = "paste your API token (dtk_...); an administrator issues it with `daedalus token create --person <you>`"
        return _login_again(request, target, why)
    try:
        session_id, session = await asyncio.to_thread(sessions(request).sign_in, token)
    except Refused as why:
        return _login_again(request, target, str(why))
    response = RedirectResponse(target, status.HTTP_303_SEE_OTHER)
    _set_cookie(request, response, SESSION_COOKIE, session_id, max_age=None)
    response.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    flash(session, "ok", f"signed in as {session.person}")
    return response


def _login_again(request: Request, target: str, message: str) -> Response:
    marker = secrets.token_urlsafe(32)
    response = page(
        request,
        "login.html",
        status.HTTP_401_UNAUTHORIZED,
        login_csrf=marker,
        next=target,
        message=message,
        session=None,
    )
    _set_cookie(request, response, LOGIN_COOKIE, marker, max_age=3600)
    return response


def _set_cookie(request: Request, response: Response, name: str, value: str, max_age: int | None) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


@router.post("/logout")
async def logout(request: Request) -> Response:
    done = await action(request)
    if isinstance(done, Response):
        return done
    sessions(request).sign_out(request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/console/login", status.HTTP_303_SEE_OTHER)
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    return response


# ---- pages ---------------------------------------------------------------------------------------------


def signed_in(request: Request) -> ConsoleSession | Response:
    try:
        return sessions(request).current(request.cookies.get(SESSION_COOKIE))
    except Refused as why:
        return to_sign_in(request, str(why))


def _common(request: Request, session: ConsoleSession) -> dict[str, Any]:
    shown, session.flash = session.flash, []
    return {"session": session, "flash": shown, "version": latest_change(get_context(request))}


@router.get("")
async def waiting(request: Request) -> Response:
    session = signed_in(request)
    if isinstance(session, Response):
        return session
    context = get_context(request)
    try:
        found = await views.queue(context, session.person)
    except HTTPException as error:
        return refused_page(request, error.status_code, str(error.detail), session)
    common = await asyncio.to_thread(_common, request, session)
    return page(
        request,
        "queue.html",
        mine=[w for w in found if w.mine],
        others=[w for w in found if not w.mine],
        **common,
    )


@router.get("/tickets")
async def tickets(request: Request) -> Response:
    session = signed_in(request)
    if isinstance(session, Response):
        return session
    context = get_context(request)

    def read() -> list[Any]:
        with session_scope(context.engine) as db:
            return list(queries.list_tickets(session=db, limit=500))

    rows = await asyncio.to_thread(read)
    common = await asyncio.to_thread(_common, request, session)
    return page(request, "tickets.html", rows=rows, **common)


@router.get("/tickets/{ticket_id}")
async def ticket(request: Request, ticket_id: str) -> Response:
    session = signed_in(request)
    if isinstance(session, Response):
        return session
    known = await _ticket_or_refusal(request, session, ticket_id)
    if isinstance(known, Response):
        return known
    common = await asyncio.to_thread(_common, request, session)
    return page(request, "ticket.html", t=known, kinds=[k.value for k in DecisionKind], **common)


@router.get("/tickets/{ticket_id}/trail")
async def trail(request: Request, ticket_id: str) -> Response:
    session = signed_in(request)
    if isinstance(session, Response):
        return session
    known = await _ticket_or_refusal(request, session, ticket_id)
    if isinstance(known, Response):
        return known
    common = await asyncio.to_thread(_common, request, session)
    return page(request, "trail.html", t=known, **common)


async def _ticket_or_refusal(
    request: Request, session: ConsoleSession, ticket_id: str
) -> views.TicketPage | Response:
    import re

    if not re.fullmatch(TICKET_ID_PATTERN, ticket_id):
        return refused_page(
            request, status.HTTP_404_NOT_FOUND, f"{ticket_id!r} is not a ticket id (e.g. 4, 6b)", session
        )
    try:
        found = await views.ticket_page(get_context(request), ticket_id, session.person)
    except HTTPException as error:
        return refused_page(request, error.status_code, str(error.detail), session)
    if found is None:
        return refused_page(
            request,
            status.HTTP_404_NOT_FOUND,
            f"no ticket {ticket_id!r}: neither Temporal nor the store knows it (the tickets page lists them)",
            session,
        )
    return found


@router.get("/report")
async def report(request: Request, since: str = "24h") -> Response:
    session = signed_in(request)
    if isinstance(session, Response):
        return session
    try:
        return await report_response(get_context(request), since, "html")
    except HTTPException as error:
        return refused_page(request, error.status_code, str(error.detail), session)


@router.get("/changes")
async def changes(request: Request) -> Response:
    """What the pages poll for live updates: a version that moves when anything is recorded."""
    try:
        sessions(request).current(request.cookies.get(SESSION_COOKIE))
    except Refused as why:
        return JSONResponse(
            {"detail": str(why)}, status.HTTP_401_UNAUTHORIZED, headers={"Cache-Control": "no-store"}
        )
    version = await asyncio.to_thread(latest_change, get_context(request))
    return JSONResponse({"version": version}, headers={"Cache-Control": "no-store"})


@router.get("/static/{name}")
async def static(name: str) -> Response:
    found = STATIC.get(name)
    if found is None:
        return Response("not found", status.HTTP_404_NOT_FOUND, media_type="text/plain")
    media_type, path = found
    return Response(path.read_bytes(), media_type=media_type, headers={"X-Content-Type-Options": "nosniff"})


# ---- actions: every one through the service layer, with the server's policy --------------------------


@router.post("/decisions")
async def decide(request: Request) -> Response:
    done = await action(request)
    if isinstance(done, Response):
        return done
    context = get_context(request)
    request_id, option = done.text("request_id"), done.text("option")
    origin = f"/console/tickets/{done.text('ticket_id')}" if done.text("ticket_id") else "/console"
    try:
        decision = Decision(
            request_id=request_id,
            option=option,
            decided_by=done.session.person,
            channel=Channel.CONSOLE,
            note=done.fields.get("note", ""),
            lesson=done.fields.get("lesson") == "on",
        )
    except ValidationError as error:
        flash(done.session, "error", problems(error, f"your answer to {request_id or 'the request'}"))
        return back(done, origin)
    if decision.lesson and not decision.note.strip():
        flash(
            done.session, "error", "a lesson needs a note: write what later agents should know, or untick it"
        )
        return back(done, origin)
    timeout_s = context.settings.update_timeout_s
    try:
        client = await context.client()
        accepted = await within(
            services.decide(client, decision, store=context.engine, policy=context.policy),
            timeout_s,
            request_id,
        )
    except (RequestRefused, HTTPException) as error:
        flash(done.session, "error", f"refused: {refusal_text(error)}")
        return back(done, origin)
    now = ""
    try:
        after = await within(state_after(client, decision, accepted), timeout_s, request_id)
        if isinstance(after, TicketState):
            now = f"; ticket {after.spec.id} is now {after.status.value}"
    except (RequestRefused, HTTPException):
        now = "; it is being recorded"
    lesson = " (your note is recorded as a lesson)" if decision.lesson else ""
    flash(done.session, "ok", f"{decision.decided_by} chose {option!r} for {request_id}{now}{lesson}")
    return back(done, origin)


@router.post("/tickets/{ticket_id}/delegations")
async def delegate(request: Request, ticket_id: str) -> Response:
    done = await action(request)
    if isinstance(done, Response):
        return done
    context = get_context(request)
    origin = f"/console/tickets/{ticket_id}"
    try:
        delegation = Delegation(
            granted_by=done.session.person,
            delegate=done.text("delegate").lower(),
            kind=done.text("kind") or DecisionKind.ESCALATION.value,
            channel=Channel.CONSOLE,
        )
    except ValidationError as error:
        flash(done.session, "error", problems(error, "the delegation"))
        return back(done, origin)
    try:
        people = await within(
            services.delegate(await context.client(), ticket_id, delegation, policy=context.policy),
            context.settings.update_timeout_s,
            ticket_id,
        )
    except (RequestRefused, HTTPException) as error:
        flash(done.session, "error", f"refused: {refusal_text(error)}")
        return back(done, origin)
    flash(
        done.session,
        "ok",
        f"ticket {ticket_id}: {delegation.kind.value} decisions may now also be made by {', '.join(people)}",
    )
    return back(done, origin)


@router.post("/tickets/{ticket_id}/cancel")
async def cancel(request: Request, ticket_id: str) -> Response:
    done = await action(request)
    if isinstance(done, Response):
        return done
    context = get_context(request)
    origin = f"/console/tickets/{ticket_id}"
    try:
        cancelling = CancelRequest(
            requested_by=done.session.person, reason=done.fields.get("reason", "").strip()
        )
    except ValidationError as error:
        flash(done.session, "error", problems(error, "the cancellation (give a reason)"))
        return back(done, origin)
    try:
        state = await within(
            services.cancel(await context.client(), ticket_id, cancelling),
            context.settings.update_timeout_s,
            ticket_id,
        )
    except (RequestRefused, HTTPException) as error:
        flash(done.session, "error", f"refused: {refusal_text(error)}")
        return back(done, origin)
    flash(
        done.session,
        "ok",
        f"ticket {ticket_id}: cancel requested by {cancelling.requested_by} ({state.status.value})",
    )
    return back(done, origin)
