"""Seals: the audit trail made tamper-evident to someone who can write the database.

The hash chain (store/chain.py) shows a naive edit, but anyone who can write the database can also recompute
the hashes. So every event also carries a seal: an HMAC, under a key the database does not hold (the audit key,
`DAEDALUS_AUDIT_KEY`, or the file `audit.key_file`), over the event's chain hash and over what the event
decided: the decision request it asked, the answer it recorded, the verdicts it wrote. A rewritten decider, a
verdict flipped from FAIL to PASS, or a forged event has no valid seal; the workflows' own record of how far
each trail got (daedalus.store.anchors) shows a truncated or deleted one.

Events written before seals existed are sealed once, as they stand, the first time a worker starts with a key
(`seal_unsealed`): trust on first use, recorded in the worker's log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from sqlalchemy import bindparam, update
from sqlmodel import Session, col, select

from daedalus.errors import SetupError
from daedalus.schemas.audit import AuditKind
from daedalus.store.tables import AuditEventRow, DecisionRow, VerdictRow

SEAL_PREFIX = "hmac-sha256:"
KEY_BYTES = 32


class AuditSettings(BaseModel):
    """The `audit` section of daedalus.config.Settings (DAEDALUS_AUDIT_KEY, DAEDALUS_AUDIT_KEY_FILE)."""

    model_config = ConfigDict(extra="forbid")

    key: SecretStr | None = Field(
        default=None, description="the audit key (hex); keep it out of the database's reach"
    )
    key_file: Path | None = Field(
        default=None, description="where the audit key is kept when `key` is not set; None = <home>/audit.key"
    )


@dataclass(frozen=True)
class AuditKey:
    secret: bytes

    def __repr__(self) -> str:
        return "AuditKey(<secret>)"

    @classmethod
    def of(cls, settings: AuditSettings, home: Path, *, create: bool) -> AuditKey | None:
        """The configured key, or the key file's (made, 0600, when `create` and there is none yet)."""
        if settings.key is not None:
            try:
                return cls(bytes.fromhex(settings.key.get_secret_value()))
            except ValueError:
                raise SetupError("DAEDALUS_AUDIT_KEY must be hex (e.g. `openssl rand -hex 32`)") from None
        path = settings.key_file or home / "audit.key"
        if not path.exists():
            if not create:
                return None
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_hex(KEY_BYTES))
        try:
            return cls(bytes.fromhex(path.read_text().strip()))
        except (OSError, ValueError) as error:
            raise SetupError(f"cannot read the audit key {path}: {error}") from error


def _instant(at: datetime | None) -> str | None:
    if at is None:
        return None
    aware = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    return aware.isoformat(timespec="microseconds")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=_instant)


def _request(row: DecisionRow | None) -> list[Any] | None:
    if row is None:
        return None
    return [row.request_id, row.ticket_id, row.kind, row.question, row.options, row.deciders,
            _instant(row.requested_at)]  # fmt: skip


def _answer(row: DecisionRow | None) -> list[Any] | None:
    if row is None:
        return None
    return [row.request_id, row.option, row.decided_by, row.channel, row.note, _instant(row.decided_at)]


VERDICT_FIELDS = [name for name in VerdictRow.model_fields if name != "id"]


def _verdicts(rows: list[VerdictRow]) -> list[dict[str, Any]]:
    return [
        {name: getattr(row, name) for name in VERDICT_FIELDS} for row in sorted(rows, key=lambda r: r.gate)
    ]


def content(session: Session, row: AuditEventRow) -> dict[str, Any]:
    """What the event decided, as the store holds it now: its request or answer, its verdicts."""
    found: dict[str, Any] = {}
    request_id = row.detail.get("request")
    if request_id and row.kind == AuditKind.DECISION_REQUESTED.value:
        found["request"] = _request(session.get(DecisionRow, request_id))
    elif request_id and row.kind == AuditKind.DECIDED.value:
        found["answer"] = _answer(session.get(DecisionRow, request_id))
    verdicts = session.exec(
        select(VerdictRow).where(col(VerdictRow.run_id) == row.run_id, col(VerdictRow.seq) == row.seq)
    ).all()
    if verdicts:
        found["verdicts"] = _verdicts(list(verdicts))
    return found


def seal(key: AuditKey, row: AuditEventRow, decided: dict[str, Any]) -> str:
    message = _canonical([row.hash, decided])
    return SEAL_PREFIX + hmac.new(key.secret, message.encode(), hashlib.sha256).hexdigest()


_EVENTS = AuditEventRow.__table__  # type: ignore[attr-defined]
SET_SEAL = (
    update(_EVENTS)
    .where(_EVENTS.c.run_id == bindparam("run"), _EVENTS.c.seq == bindparam("event_seq"))
    .values(seal=bindparam("value"))
)


def seal_written(session: Session, key: AuditKey, row: AuditEventRow) -> None:
    """Seal an event just written (its decision and verdict rows are in the same transaction)."""
    value = seal(key, row, content(session, row))
    session.connection().execute(SET_SEAL, {"run": row.run_id, "event_seq": row.seq, "value": value})


def seal_unsealed(session: Session, key: AuditKey) -> int:
    """Seal every event written before seals existed, as it stands now (trust on first use)."""
    unsealed = session.exec(select(AuditEventRow).where(col(AuditEventRow.seal).is_(None))).all()
    for row in unsealed:
        seal_written(session, key, row)
    return len(unsealed)


def seal_is_valid(key: AuditKey, session: Session, row: AuditEventRow) -> bool:
    if not row.seal:
        return False
    return hmac.compare_digest(row.seal, seal(key, row, content(session, row)))
