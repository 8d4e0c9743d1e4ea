"""Seals on SQLite and PostgreSQL: a database writer who recomputes every hash still cannot rewrite a decider,
flip a verdict or forge an event unseen (attacks of the containment review, run as SQL on real rows)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy import Engine, text
from sqlmodel import col, select

from daedalus.decisions.schemas import Decision, DecisionKind, DecisionRequest
from daedalus.schemas.audit import AuditKind
from daedalus.schemas.gates import GateResult, Verdict
from daedalus.store import chain
from daedalus.store.chain import BreakKind
from daedalus.store.database import session_scope
from daedalus.store.seals import AuditKey, seal_unsealed
from daedalus.store.tables import AuditEventRow
from tests.store.test_chain import sql, trail
from tests.store.test_records import record, write
from tests.support import TEST_AUDIT_KEY

REQUEST = DecisionRequest(
    id="4-dispatch-1",
    ticket_id="4",
    kind=DecisionKind.DISPATCH,
    question="Dispatch ticket 4?",
    options=["approve", "reject"],
    deciders=["wayne"],
    requested_at=datetime(2026, 11, 1, 9, 1, tzinfo=UTC),
)


def decided_ticket(engine: Engine) -> None:
    """Filed, a dispatch asked and answered by wayne, a gate that FAILED."""
    write(engine, record(1, kind=AuditKind.FILED))
    write(
        engine,
        record(
            2, kind=AuditKind.DECISION_REQUESTED, detail={"request": REQUEST.id}, decision_request=REQUEST
        ),
    )
    answer = Decision(request_id=REQUEST.id, option="approve", decided_by="wayne", channel="cli")
    write(engine, record(3, kind=AuditKind.DECIDED, detail={"request": REQUEST.id}, decision=answer))
    failed = GateResult(
        gate="decode", metric="decode_tps", verdict=Verdict.FAIL, reason="median 28.9 < 55", rule=">= 55",
        method="server timings", median=28.9, samples=[28.8, 28.9, 29.0, 28.9, 28.9], host="pc", commit="abc",
    )  # fmt: skip
    write(engine, record(4, kind=AuditKind.GATE, gate_results=[failed], attempt=1))


def verify(engine: Engine, key: AuditKey | None = TEST_AUDIT_KEY) -> list[chain.ChainBreak]:
    with session_scope(engine) as session:
        return chain.verify(session, key=key)[1]


def rehash(engine: Engine, ticket_id: str = "4") -> None:
    """What a database writer who knows the chain's recipe does after an edit: recompute every hash in order."""
    rows = trail(engine, ticket_id)
    prev = chain.GENESIS
    with engine.begin() as connection:
        for row in rows:
            digest = chain.row_hash(row, prev)
            connection.execute(
                text("UPDATE audit_events SET prev_hash = :p, hash = :h WHERE id = :id"),
                {"p": prev, "h": digest, "id": row.id},
            )
            prev = digest


def test_every_event_is_sealed_and_verifies(store_engine: Engine) -> None:
    decided_ticket(store_engine)
    assert all(row.seal and row.seal.startswith("hmac-sha256:") for row in trail(store_engine))
    assert verify(store_engine) == []


def test_a_rewritten_decider_with_recomputed_hashes_is_named(store_engine: Engine) -> None:
    decided_ticket(store_engine)
    sql(store_engine, "UPDATE decisions SET decided_by = 'carol' WHERE request_id = :r", r=REQUEST.id)
    sql(store_engine, "UPDATE audit_events SET actor = 'carol' WHERE seq = 3")
    rehash(store_engine)
    assert verify(store_engine, key=None) == [], "the plain chain is fooled"
    [found] = verify(store_engine)
    assert (found.kind, found.seq) == (BreakKind.FORGED, 3), found.message
    assert "does not match its seal" in found.message


def test_a_verdict_flipped_from_fail_to_pass_is_named(store_engine: Engine) -> None:
    decided_ticket(store_engine)
    sql(store_engine, "UPDATE verdicts SET verdict = 'PASS', median = 56.0 WHERE gate = 'decode'")
    [found] = verify(store_engine)
    assert (found.kind, found.seq) == (BreakKind.FORGED, 4), found.message


def test_a_forged_event_appended_with_a_valid_chain_is_named(store_engine: Engine) -> None:
    decided_ticket(store_engine)
    last = trail(store_engine)[-1]
    forged = last.model_copy(
        update={
            "id": None,
            "seq": 5,
            "kind": "closed",
            "actor": "daedalus",
            "status": "passed",
            "summary": "closed passed",
            "seal": None,
        }
    )
    digest = chain.row_hash(forged, last.hash or "")
    with store_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO audit_events (workflow_id, run_id, seq, ticket_id, kind, actor, at, status, summary, "
                "detail, prev_hash, hash) VALUES (:w, :r, 5, '4', 'closed', 'daedalus', :at, 'passed', "
                "'closed passed', :d, :p, :h)"
            ),
            {"w": last.workflow_id, "r": last.run_id, "at": last.at, "d": json.dumps(forged.detail),
             "p": last.hash, "h": digest},
        )  # fmt: skip
    [found] = verify(store_engine)
    assert (found.kind, found.seq) == (BreakKind.FORGED, 5) and "has no seal" in found.message


def test_an_answer_or_a_verdict_no_event_recorded_is_named(store_engine: Engine) -> None:
    decided_ticket(store_engine)
    sql(store_engine, "DELETE FROM audit_events WHERE seq IN (3, 4)")
    sql(store_engine, "DELETE FROM tickets")
    rehash(store_engine)
    [found] = verify(store_engine)
    assert found.kind is BreakKind.UNRECORDED and "wayne chose 'approve'" in found.message


def test_events_written_before_seals_are_sealed_once_as_they_stand(store_engine: Engine) -> None:
    decided_ticket(store_engine)
    sql(store_engine, "UPDATE audit_events SET seal = NULL")
    [found] = verify(store_engine)
    assert found.kind is BreakKind.FORGED and "has no seal" in found.message
    with session_scope(store_engine) as session:
        assert seal_unsealed(session, TEST_AUDIT_KEY) == 4
    with session_scope(store_engine) as session:
        assert seal_unsealed(session, TEST_AUDIT_KEY) == 0
        assert session.exec(select(AuditEventRow).where(col(AuditEventRow.seal).is_(None))).all() == []
    assert verify(store_engine) == []
    other = AuditKey(bytes(32))
    assert verify(store_engine, key=other)[0].kind is BreakKind.FORGED, "another key's seals do not verify"
