"""API bearer tokens: issued once, stored as salted hashes, checked in constant time, revocable, expirable.

A token reads `dtk_<token_id>_<secret>`: `token_id` (8 hex characters) is public, named by `daedalus token list`
and `revoke`; `secret` is 256 random bits and never stored. The store keeps sha256(salt + secret) with a
random per-token salt.

Why SHA-256 and not scrypt/argon2: slow hashes exist to make guessing a *low-entropy* password expensive. A
256-bit random secret cannot be guessed however fast the hash is, so a slow hash would only cost every API
request tens of milliseconds of CPU (and make a flood of bad tokens a denial of service) for no gain. The salt
makes equal secrets (there are none in practice) hash differently and rules out precomputed tables.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum

from sqlalchemy import Engine
from sqlmodel import select

from daedalus.decisions.schemas import PERSON_PATTERN
from daedalus.errors import TokenError
from daedalus.store.database import session_scope
from daedalus.store.tables import ApiTokenRow

PREFIX = "dtk"
TOKEN_PATTERN = re.compile(r"^dtk_(?P<token_id>[0-9a-f]{8})_(?P<secret>[A-Za-z0-9_-]{43})$")
_DUMMY_SALT = bytes(16)


class Refusal(Enum):
    """Why a presented token does not identify anyone. Revoked and expired are said only to the token's
    holder (the secret matched); anyone else learns only that the token is unknown."""

    UNKNOWN = "unknown bearer token; ask your Daedalus admin for one (`daedalus token create --person <you>`)"
    REVOKED = "this token was revoked; ask your Daedalus admin for a new one"
    EXPIRED = "this token has expired; ask your Daedalus admin for a new one"


@dataclass(frozen=True)
class Issued:
    token: str
    """The plaintext: shown once, stored nowhere."""
    row: ApiTokenRow


def _digest(salt: bytes, secret: str) -> str:
    return hashlib.sha256(salt + secret.encode()).hexdigest()


def issue(engine: Engine, person: str, *, created_by: str, expires_in: timedelta | None = None) -> Issued:
    """A new token for `person`; only its hash is written."""
    token = f"{PREFIX}_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"
    return Issued(token=token, row=add(engine, person, token, created_by=created_by, expires_in=expires_in))


def add(
    engine: Engine, person: str, token: str, *, created_by: str, expires_in: timedelta | None = None
) -> ApiTokenRow:
    """Store the hash of a token made elsewhere (`issue` makes one; a secret manager or a test may too)."""
    person = person.lower()
    if not re.match(PERSON_PATTERN, person):
        raise TokenError(
            f"{person!r} is not a Daedalus person name (lowercase letters, digits, '_', '.', '-'; "
            f"starting with a letter; at most 32 characters)"
        )
    if expires_in is not None and expires_in <= timedelta(0):
        raise TokenError(f"a token must expire in the future, not in {expires_in}")
    match = TOKEN_PATTERN.match(token)
    if match is None:
        raise TokenError("a Daedalus API token reads dtk_<8 hex digits>_<43 URL-safe base64 characters>")
    salt = secrets.token_bytes(16)
    now = datetime.now(UTC)
    row = ApiTokenRow(
        token_id=match["token_id"],
        person=person,
        salt=salt.hex(),
        digest=_digest(salt, match["secret"]),
        created_at=now,
        created_by=created_by,
        expires_at=now + expires_in if expires_in is not None else None,
    )
    with session_scope(engine) as session:
        if session.get(ApiTokenRow, row.token_id) is not None:
            raise TokenError(f"an API token with id {row.token_id} exists already; make another token")
        session.add(row)
    return row


def identify(engine: Engine, presented: str) -> str | Refusal:
    """The person a presented token belongs to, or why it is refused.

    The secret is always hashed and compared (against a dummy when the id is unknown), with
    `hmac.compare_digest`, so the time taken says nothing about which part of a guess was right.
    """
    match = TOKEN_PATTERN.match(presented)
    token_id, secret = (match["token_id"], match["secret"]) if match else ("", presented)
    row = None
    if match:
        with session_scope(engine) as session:
            row = session.get(ApiTokenRow, token_id)
    salt = bytes.fromhex(row.salt) if row is not None else _DUMMY_SALT
    expected = row.digest if row is not None else _digest(_DUMMY_SALT, "")
    matches = hmac.compare_digest(_digest(salt, secret), expected)
    if row is None or not matches:
        return Refusal.UNKNOWN
    if row.revoked_at is not None:
        return Refusal.REVOKED
    if row.expires_at is not None and _utc(row.expires_at) <= datetime.now(UTC):
        return Refusal.EXPIRED
    return row.person


def listed(engine: Engine, person: str | None = None) -> list[ApiTokenRow]:
    """Every token (never its secret), newest first."""
    with session_scope(engine) as session:
        query = select(ApiTokenRow).order_by(ApiTokenRow.created_at.desc())  # type: ignore[attr-defined]
        if person is not None:
            query = query.where(ApiTokenRow.person == person.lower())
        return list(session.exec(query).all())


def revoke(engine: Engine, token_id: str) -> ApiTokenRow:
    """Revoke a token by its id (or by the whole token); revoking twice keeps the first time."""
    match = TOKEN_PATTERN.match(token_id)
    token_id = match["token_id"] if match else token_id
    with session_scope(engine) as session:
        row = session.get(ApiTokenRow, token_id)
        if row is None:
            raise TokenError(f"no API token with id {token_id!r}; `daedalus token list` shows the ids")
        if row.revoked_at is None:
            row.revoked_at = datetime.now(UTC)
            session.add(row)
    return row


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
