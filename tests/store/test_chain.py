"""The audit hash chain on SQLite and PostgreSQL: real rows are changed, deleted and reordered with SQL, and
`verify` (and `daedalus audit verify`) names the first event that no longer verifies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from daedalus.ports import free_port
from daedalus.schemas.audit import AuditKind
from daedalus.store import chain
from daedalus.store.chain import GENESIS, BreakKind
from daedalus.store.database import make_engine, migrate, session_scope
from daedalus.store.tables import AuditEventRow
from tests.store.test_records import record, write
from tests.support import TEST_AUDIT_KEY

DAEDALUS = str(Path(sys.executable).parent / "daedalus")


def trail(engine: Engine, ticket_id: str = "4") -> list[AuditEventRow]:
    with session_scope(engine) as session:
        query = (
            select(AuditEventRow).where(AuditEventRow.ticket_id == ticket_id).order_by(col(AuditEventRow.id))
        )
        return list(session.exec(query))


def verify(engine: Engine) -> tuple[int, list[chain.ChainBreak]]:
    with session_scope(engine) as session:
        return chain.verify(session)


def five_events(engine: Engine) -> list[AuditEventRow]:
    for seq in range(1, 6):
        write(engine, record(seq, kind=AuditKind.TRANSITION if seq > 1 else AuditKind.FILED))
    write(engine, record(1, ticket_id="other", run_id="run-o"))
    return trail(engine)


def sql(engine: Engine, statement: str, **params: object) -> None:
    with engine.begin() as connection:
        connection.execute(text(statement), params)


def test_each_event_chains_to_its_predecessor_and_a_rewrite_keeps_the_hash(store_engine: Engine) -> None:
    rows = five_events(store_engine)
    assert rows[0].prev_hash == GENESIS
    assert [r.prev_hash for r in rows[1:]] == [r.hash for r in rows[:-1]]
    assert all(r.hash and len(r.hash) == 64 for r in rows)
    assert not write(store_engine, record(3))  # an activity retried after its event was written
    assert trail(store_engine) == rows
    assert verify(store_engine) == (6, [])


def test_a_refiled_ticket_id_continues_its_trail(store_engine: Engine) -> None:
    rows = five_events(store_engine)
    write(store_engine, record(1, run_id="run-2"))
    refiled = trail(store_engine)[-1]
    assert refiled.run_id == "run-2" and refiled.prev_hash == rows[-1].hash
    assert verify(store_engine)[1] == []


def test_a_changed_event_is_named(store_engine: Engine) -> None:
    rows = five_events(store_engine)
    sql(store_engine, "UPDATE audit_events SET summary = 'approved by wayne' WHERE id = :id", id=rows[2].id)
    _, [found] = verify(store_engine)
    assert (found.kind, found.ticket_id, found.row_id, found.seq) == (BreakKind.CHANGED, "4", rows[2].id, 3)
    assert "event #3 of ticket-4" in found.message and "changed after it was written" in found.message


def test_a_changed_event_with_a_recomputed_hash_still_breaks_at_its_successor(store_engine: Engine) -> None:
    rows = five_events(store_engine)
    forged = rows[2].model_copy(update={"actor": "mallory"})
    sql(
        store_engine, "UPDATE audit_events SET actor = 'mallory', hash = :h WHERE id = :id",
        h=chain.row_hash(forged, rows[2].prev_hash or ""), id=rows[2].id,
    )  # fmt: skip
    _, [found] = verify(store_engine)
    assert found.row_id == rows[3].id and found.seq == 4


def test_a_deleted_event_is_named_by_its_successor(store_engine: Engine) -> None:
    rows = five_events(store_engine)
    sql(store_engine, "DELETE FROM audit_events WHERE id = :id", id=rows[1].id)
    _, [found] = verify(store_engine)
    assert (found.kind, found.row_id, found.seq) == (BreakKind.DELETED, rows[2].id, 3)
    assert "after event #1 of ticket-4" in found.message


def test_deleting_the_first_event_is_found(store_engine: Engine) -> None:
    rows = five_events(store_engine)
    sql(store_engine, "DELETE FROM audit_events WHERE id = :id", id=rows[0].id)
    _, [found] = verify(store_engine)
    assert (found.kind, found.row_id) == (BreakKind.DELETED, rows[1].id)
    assert "at the start of the trail" in found.message


def test_deleting_the_last_events_is_found_through_the_projection(store_engine: Engine) -> None:
    rows = five_events(store_engine)
    sql(store_engine, "DELETE FROM audit_events WHERE id >= :id AND ticket_id = '4'", id=rows[3].id)
    _, [found] = verify(store_engine)
    assert (found.kind, found.seq) == (BreakKind.TRUNCATED, 5)


def test_reordered_events_are_named(store_engine: Engine) -> None:
    rows = five_events(store_engine)
    a, b = rows[1].id, rows[3].id
    # swap the two rows' places in the write order (their ids), every field kept
    sql(store_engine, "UPDATE audit_events SET id = -1 WHERE id = :a", a=a)
    sql(store_engine, "UPDATE audit_events SET id = :a WHERE id = :b", a=a, b=b)
    sql(store_engine, "UPDATE audit_events SET id = :b WHERE id = -1", b=b)
    _, [found] = verify(store_engine)
    assert (found.kind, found.row_id, found.seq) == (BreakKind.REORDERED, a, 4)


def test_reordering_by_swapping_sequence_numbers_is_a_change(store_engine: Engine) -> None:
    rows = five_events(store_engine)
    sql(store_engine, "UPDATE audit_events SET seq = -1 WHERE id = :id", id=rows[1].id)
    sql(store_engine, "UPDATE audit_events SET seq = 2 WHERE id = :id", id=rows[2].id)
    sql(store_engine, "UPDATE audit_events SET seq = 3 WHERE id = :id", id=rows[1].id)
    _, [found] = verify(store_engine)
    assert (found.kind, found.row_id) == (BreakKind.CHANGED, rows[1].id)


def test_two_rows_cannot_name_the_same_predecessor(store_engine: Engine) -> None:
    rows = five_events(store_engine)
    with pytest.raises(IntegrityError, match=r"uq_audit_chain|UNIQUE constraint failed"):
        sql(
            store_engine,
            "INSERT INTO audit_events (workflow_id, run_id, seq, ticket_id, kind, actor, at, status, summary, "
            "detail, prev_hash, hash) SELECT workflow_id, 'fork', seq, ticket_id, kind, actor, at, status, "
            "summary, detail, prev_hash, hash FROM audit_events WHERE id = :id",
            id=rows[4].id,
        )


def test_migration_chains_events_written_before_it(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    from alembic import command
    from alembic.config import Config

    from daedalus.store.database import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0001")
        for seq in (1, 2, 3):
            connection.execute(
                text(
                    "INSERT INTO audit_events (workflow_id, run_id, seq, ticket_id, kind, actor, at, status, "
                    "summary, detail) VALUES ('ticket-4', 'r', :seq, '4', 'transition', 'daedalus', "
                    "'2026-11-01 09:00:00.000000', 'dispatched', :summary, '{}')"
                ),
                {"seq": seq, "summary": f"event {seq}"},
            )
    migrate(engine)
    assert verify(engine) == (3, [])
    write(engine, record(4, run_id="r"))
    rows = trail(engine)
    assert rows[-1].prev_hash == rows[-2].hash and verify(engine)[1] == []


def test_audit_verify_command_exits_non_zero_and_names_the_event(tmp_path: Path) -> None:
    home = tmp_path / "home"
    engine = make_engine(f"sqlite:///{home / 'daedalus.db'}")
    migrate(engine)
    rows = five_events(engine)
    (home / "audit.key").write_text(TEST_AUDIT_KEY.secret.hex())  # the key the events were sealed with
    env = {
        **os.environ,
        "DAEDALUS_HOME": str(home),
        "COLUMNS": "300",
        "DAEDALUS_TEMPORAL_PORT": str(free_port()),
    }

    def run() -> subprocess.CompletedProcess[str]:
        command = [DAEDALUS, "audit", "verify"]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    ok = run()
    assert ok.returncode == 0 and "6 events, every chain and seal intact" in ok.stdout, ok.stdout + ok.stderr
    assert "Temporal is unreachable" in ok.stdout, "a verify that could not ask Temporal says so"
    sql(engine, "UPDATE audit_events SET actor = 'mallory' WHERE id = :id", id=rows[1].id)
    engine.dispose()
    tampered = run()
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert "changed 4: event #2 of ticket-4" in " ".join(tampered.stdout.split())
    listing = subprocess.run([DAEDALUS, "audit", "--ticket", "4"], env=env, capture_output=True, text=True)
    assert listing.returncode == 0 and "mallory" in listing.stdout
