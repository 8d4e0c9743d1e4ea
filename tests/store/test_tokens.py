"""API tokens in the store: only salted hashes at rest; unknown, wrong, revoked and expired tokens identify no one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text, update

from daedalus.errors import TokenError
from daedalus.store import tokens
from daedalus.store.database import session_scope
from daedalus.store.tables import ApiTokenRow
from daedalus.store.tokens import Refusal


def test_only_a_salted_hash_is_stored(store_engine: Engine) -> None:
    issued = tokens.issue(store_engine, "Wayne", created_by="admin")
    again = tokens.issue(store_engine, "wayne", created_by="admin")
    secret = issued.token.split("_", 2)[2]
    assert issued.token.startswith(f"dtk_{issued.row.token_id}_") and len(secret) == 43
    with store_engine.connect() as connection:
        rows = [dict(r._mapping) for r in connection.execute(text("SELECT * FROM api_tokens"))]
    dumped = repr(rows)
    assert issued.token not in dumped and secret not in dumped and again.token.split("_", 2)[2] not in dumped
    assert {r["person"] for r in rows} == {"wayne"} and len({r["salt"] for r in rows}) == 2
    assert tokens.identify(store_engine, issued.token) == "wayne"
    assert tokens.identify(store_engine, again.token) == "wayne"


def test_wrong_unknown_and_malformed_tokens_identify_no_one(store_engine: Engine) -> None:
    issued = tokens.issue(store_engine, "wayne", created_by="admin")
    token_id = issued.row.token_id
    other = tokens.issue(store_engine, "mallory", created_by="admin").token
    wrong_secret = f"dtk_{token_id}_{other.split('_', 2)[2]}"  # wayne's id with mallory's secret
    for presented in (wrong_secret, f"dtk_ffffffff_{'a' * 43}", "wayne", "", issued.token + "x", token_id):
        assert tokens.identify(store_engine, presented) is Refusal.UNKNOWN, presented


def test_revoked_and_expired_tokens_are_refused(store_engine: Engine) -> None:
    kept = tokens.issue(store_engine, "wayne", created_by="admin")
    revoked = tokens.issue(store_engine, "wayne", created_by="admin")
    first = tokens.revoke(store_engine, revoked.row.token_id).revoked_at
    assert tokens.revoke(store_engine, revoked.token).revoked_at == first  # by the whole token; kept once
    assert tokens.identify(store_engine, revoked.token) is Refusal.REVOKED
    assert tokens.identify(store_engine, kept.token) == "wayne"

    expiring = tokens.issue(store_engine, "lead", created_by="admin", expires_in=timedelta(hours=1))
    assert tokens.identify(store_engine, expiring.token) == "lead"
    with session_scope(store_engine) as session:
        session.exec(  # type: ignore[call-overload]
            update(ApiTokenRow)
            .where(ApiTokenRow.token_id == expiring.row.token_id)  # type: ignore[arg-type]
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    assert tokens.identify(store_engine, expiring.token) is Refusal.EXPIRED
    listed = {row.token_id: row for row in tokens.listed(store_engine)}
    assert set(listed) == {kept.row.token_id, revoked.row.token_id, expiring.row.token_id}
    assert (
        listed[revoked.row.token_id].revoked_at is not None and listed[kept.row.token_id].revoked_at is None
    )
    assert [r.token_id for r in tokens.listed(store_engine, "LEAD")] == [expiring.row.token_id]


def test_bad_requests_are_refused_and_write_nothing(store_engine: Engine) -> None:
    with pytest.raises(TokenError, match="not a Daedalus person name"):
        tokens.issue(store_engine, "Wayne Smith", created_by="admin")
    with pytest.raises(TokenError, match="must expire in the future"):
        tokens.issue(store_engine, "wayne", created_by="admin", expires_in=timedelta(0))
    with pytest.raises(TokenError, match="reads dtk_<8 hex digits>"):
        tokens.add(store_engine, "wayne", "s3cret", created_by="admin")
    with pytest.raises(TokenError, match=r"no API token with id 'deadbeef'.*daedalus token list"):
        tokens.revoke(store_engine, "deadbeef")
    assert tokens.listed(store_engine) == []
    made = f"dtk_0000abcd_{'z' * 43}"
    tokens.add(store_engine, "wayne", made, created_by="admin")
    with pytest.raises(TokenError, match="exists already"):
        tokens.add(store_engine, "mallory", made, created_by="admin")
    assert tokens.identify(store_engine, made) == "wayne"
