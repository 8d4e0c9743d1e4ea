"""Console sessions: a person signs in with their API token and gets a session cookie.

The cookie carries only a random session id (HttpOnly, SameSite=Strict, Path=/console, Secure over HTTPS); the
token stays on the server, in the session, and is checked again on every request, so a revoked or expired token
ends its sessions at once. Every POST carries the session's CSRF token in a hidden form field, compared in
constant time; the sign-in form, made before there is a session, carries one that must match a cookie of its own
(double submit), so another site can neither act in a signed-in browser nor sign a browser in as someone else.

Sessions live in the API process's memory: restarting the API signs everyone out, and several API processes
behind one address need sticky routing (or each person signs in to each).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field

from sqlalchemy import Engine

from daedalus.store import tokens

SESSION_COOKIE = "daedalus_console"
LOGIN_COOKIE = "daedalus_console_login"
COOKIE_PATH = "/console"
SESSION_IDLE_S = 8 * 3600
"""A session unused this long is forgotten: the decider signs in again."""
MAX_SESSIONS = 10_000
"""Bounded: a flood of sign-ins cannot grow the API's memory without end (the oldest are dropped)."""


@dataclass
class ConsoleSession:
    person: str
    token: str = field(repr=False)
    csrf: str = field(repr=False)
    last_used: float
    flash: list[tuple[str, str]] = field(default_factory=list)
    """Messages for the next page this session shows (level, text): what an action did, or why it was refused."""


class Refused(Exception):
    """A request the console will not serve as a signed-in person; the message says why and what to do."""


def csrf_matches(expected: str, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(expected.encode(), presented.encode())


class Sessions:
    """Signed-in browsers, by session id."""

    def __init__(self, engine: Engine, idle_s: float = SESSION_IDLE_S) -> None:
        self.engine = engine
        self.idle_s = idle_s
        self._sessions: dict[str, ConsoleSession] = {}
        self._lock = threading.Lock()

    def sign_in(self, presented_token: str) -> tuple[str, ConsoleSession]:
        """A new session for the token's person; Refused with the store's reason for a token that is not good."""
        found = tokens.identify(self.engine, presented_token.strip())
        if isinstance(found, tokens.Refusal):
            raise Refused(found.value)
        session_id = secrets.token_urlsafe(32)
        session = ConsoleSession(
            person=found, token=presented_token.strip(), csrf=secrets.token_urlsafe(32), last_used=time.time()
        )
        with self._lock:
            self._forget_idle()
            while len(self._sessions) >= MAX_SESSIONS:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[session_id] = session
        return session_id, session

    def current(self, session_id: str | None) -> ConsoleSession:
        """The session behind a cookie, its token checked again; Refused when there is none to use."""
        if not session_id:
            raise Refused("sign in with your API token")
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and time.time() - session.last_used > self.idle_s:
                self._sessions.pop(session_id, None)
                session = None
        if session is None:
            raise Refused(
                "your session has ended (signed out, idle too long, or the API restarted); sign in again"
            )
        found = tokens.identify(self.engine, session.token)
        if isinstance(found, tokens.Refusal):
            self.sign_out(session_id)
            raise Refused(f"{found.value}; you were signed out")
        session.last_used = time.time()
        return session

    def sign_out(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._sessions.pop(session_id, None)

    def _forget_idle(self) -> None:
        now = time.time()
        for session_id in [s for s, v in self._sessions.items() if now - v.last_used > self.idle_s]:
            del self._sessions[session_id]
