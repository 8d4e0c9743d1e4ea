"""The audit trail as a hash chain: each event stores the hash of its predecessor in its subject's trail.

A subject is a ticket id (or `training-<name>`); its trail is every event written for it, in the order the
store wrote them (row id), across re-filings of the id. An event's hash covers its predecessor's hash and
every field of the event, so changing, deleting or reordering a row breaks the chain at that row, and
`verify` names the first such event. Rows are never updated by Daedalus: any break is a change from outside.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import bindparam
from sqlmodel import Session, col, select

from daedalus.store import seals
from daedalus.store.seals import AuditKey
from daedalus.store.tables import AuditEventRow, DecisionRow, TicketRow, VerdictRow

GENESIS = "0" * 64
"""The predecessor hash of a trail's first event."""


def _instant(at: datetime) -> str:
    aware = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    return aware.isoformat(timespec="microseconds")


def event_hash(
    *,
    prev_hash: str,
    workflow_id: str,
    run_id: str,
    seq: int,
    ticket_id: str,
    kind: str,
    actor: str,
    at: datetime,
    status: str,
    summary: str,
    detail: dict[str, str],
) -> str:
    """SHA-256 over the predecessor's hash and the event's fields, as canonical JSON (same on every store)."""
    canonical = json.dumps(
        [prev_hash, workflow_id, run_id, seq, ticket_id, kind, actor, _instant(at), status, summary, detail],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def row_hash(row: AuditEventRow, prev_hash: str) -> str:
    return event_hash(
        prev_hash=prev_hash,
        workflow_id=row.workflow_id,
        run_id=row.run_id,
        seq=row.seq,
        ticket_id=row.ticket_id,
        kind=row.kind,
        actor=row.actor,
        at=row.at,
        status=row.status,
        summary=row.summary,
        detail=dict(row.detail),
    )


LATEST_HASH = (
    select(AuditEventRow.hash)
    .where(AuditEventRow.ticket_id == bindparam("subject"))
    .order_by(col(AuditEventRow.id).desc())
    .limit(1)
)
"""Built once: the store's every write asks it, and SQLAlchemy then compiles it once."""


def last_hash(session: Session, ticket_id: str) -> str:
    """The hash a new event of `ticket_id` chains to: its trail's latest event's, or GENESIS."""
    found = session.connection().execute(LATEST_HASH, {"subject": ticket_id}).scalar()
    return found if found is not None else GENESIS


class BreakKind(StrEnum):
    CHANGED = "changed"
    DELETED = "deleted"
    REORDERED = "reordered"
    TRUNCATED = "truncated"
    FORGED = "forged"
    """Its seal does not match: the event, its decision or its verdicts were written outside Daedalus."""
    UNRECORDED = "unrecorded"
    """A decision answered, or a verdict stored, that no event of the trail recorded."""


@dataclass(frozen=True)
class ChainBreak:
    """The first event of one trail that does not verify, and what happened to it."""

    ticket_id: str
    kind: BreakKind
    row_id: int | None
    run_id: str
    seq: int
    message: str


def _label(row: AuditEventRow) -> str:
    return f"event #{row.seq} of {row.workflow_id} (run {row.run_id[:12]}, row {row.id})"


def verify_trail(ticket_id: str, rows: list[AuditEventRow]) -> ChainBreak | None:
    """The first break in one subject's trail (rows in write order), or None when it verifies."""
    by_hash = {row.hash: index for index, row in enumerate(rows) if row.hash}
    expected = GENESIS
    for index, row in enumerate(rows):
        if row.prev_hash != expected:
            later = by_hash.get(row.prev_hash or "")
            if later is not None and later > index:
                kind, what = BreakKind.REORDERED, "names as its predecessor an event stored after it"
            elif row.prev_hash == GENESIS or (row.prev_hash and row.prev_hash not in by_hash):
                kind, what = BreakKind.DELETED, "names a predecessor that is no longer in the trail"
            else:
                kind, what = (
                    BreakKind.REORDERED,
                    "names as its predecessor an event that is not the one before it",
                )
            before = f"after {_label(rows[index - 1])}" if index else "at the start of the trail"
            return ChainBreak(
                ticket_id, kind, row.id, row.run_id, row.seq,
                f"{_label(row)} {what} ({before}): an event was {kind.value} here",
            )  # fmt: skip
        if row.hash != row_hash(row, expected):
            return ChainBreak(
                ticket_id, BreakKind.CHANGED, row.id, row.run_id, row.seq,
                f"{_label(row)} was changed after it was written: its fields no longer match its hash",
            )  # fmt: skip
        expected = row.hash
    return None


def _truncated(session: Session, ticket_id: str, rows: list[AuditEventRow]) -> ChainBreak | None:
    """The tickets projection remembers the last event it reflects; that event must still be in the trail.

    (A chain alone cannot see its own last events deleted.)"""
    projection = session.get(TicketRow, ticket_id)
    if projection is None:
        return None
    present = {(row.run_id, row.seq) for row in rows}
    if (projection.run_id, projection.last_seq) in present:
        return None
    return ChainBreak(
        ticket_id, BreakKind.TRUNCATED, None, projection.run_id, projection.last_seq,
        f"the trail of {ticket_id} has no event #{projection.last_seq} of run {projection.run_id[:12]}, which "
        f"the tickets projection reflects: its last events were deleted",
    )  # fmt: skip


def _forged(session: Session, key: AuditKey, ticket_id: str, rows: list[AuditEventRow]) -> ChainBreak | None:
    for row in rows:
        if not seals.seal_is_valid(key, session, row):
            what = "has no seal" if not row.seal else "does not match its seal"
            return ChainBreak(
                ticket_id, BreakKind.FORGED, row.id, row.run_id, row.seq,
                f"{_label(row)} {what}: it, or the decision or verdicts it recorded, were written outside "
                f"Daedalus (a rewrite with recomputed hashes, or a forged event)",
            )  # fmt: skip
    return None


def _unrecorded(session: Session, ticket_id: str, rows: list[AuditEventRow]) -> ChainBreak | None:
    """Decisions answered and verdicts stored must each be what an event of the trail recorded."""
    answered = {
        row.detail.get("request") for row in rows if row.kind == "decided" and row.detail.get("request")
    }
    for decision in session.exec(select(DecisionRow).where(col(DecisionRow.ticket_id) == ticket_id)):
        if decision.decided_by is not None and decision.request_id not in answered:
            return ChainBreak(
                ticket_id, BreakKind.UNRECORDED, None, "", 0,
                f"decision {decision.request_id} shows {decision.decided_by} chose {decision.option!r}, but no "
                f"event of the trail of {ticket_id} recorded that answer",
            )  # fmt: skip
    events = {(row.run_id, row.seq) for row in rows}
    for verdict in session.exec(select(VerdictRow).where(col(VerdictRow.ticket_id) == ticket_id)):
        if (verdict.run_id, verdict.seq) not in events:
            return ChainBreak(
                ticket_id, BreakKind.UNRECORDED, verdict.id, verdict.run_id, verdict.seq,
                f"verdict {verdict.verdict} of gate {verdict.gate} (row {verdict.id}) belongs to no event of the "
                f"trail of {ticket_id}",
            )  # fmt: skip
    return None


def verify(
    session: Session, ticket_ids: Iterable[str] | None = None, *, key: AuditKey | None = None
) -> tuple[int, list[ChainBreak]]:
    """Recompute every trail (or those of `ticket_ids`): (events checked, the first break of each trail).

    With the audit key, every event's seal is checked too, and every decision and verdict against the events
    that recorded them: a rewrite whose hashes were recomputed does not pass."""
    query = select(AuditEventRow).order_by(col(AuditEventRow.ticket_id), col(AuditEventRow.id))
    wanted = set(ticket_ids) if ticket_ids is not None else None
    if wanted is not None:
        query = query.where(col(AuditEventRow.ticket_id).in_(wanted))
    trails: dict[str, list[AuditEventRow]] = {}
    for row in session.exec(query):
        trails.setdefault(row.ticket_id, []).append(row)
    subjects = set(trails)
    if key is not None:  # a decision or verdict of a trail whose every event was deleted
        for table in (DecisionRow, VerdictRow):
            found_in = select(table.ticket_id)  # type: ignore[attr-defined]
            if wanted is not None:
                found_in = found_in.where(col(table.ticket_id).in_(wanted))  # type: ignore[attr-defined]
            subjects |= set(session.exec(found_in))
    projected = select(TicketRow.ticket_id)
    if wanted is not None:
        projected = projected.where(col(TicketRow.ticket_id).in_(wanted))
    subjects |= set(session.exec(projected))
    breaks = []
    for ticket_id in sorted(subjects):
        rows = trails.get(ticket_id, [])
        found = verify_trail(ticket_id, rows) or _truncated(session, ticket_id, rows)
        if found is None and key is not None:
            found = _forged(session, key, ticket_id, rows) or _unrecorded(session, ticket_id, rows)
        if found is not None:
            breaks.append(found)
    return sum(len(rows) for rows in trails.values()), breaks
