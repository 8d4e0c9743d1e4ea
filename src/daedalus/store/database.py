"""Engines, sessions and migrations for SQLite (embedded default) and PostgreSQL (production)."""

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, event, text
from sqlmodel import Session, create_engine

MIGRATIONS = Path(__file__).parent / "migrations"


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite files get their directory created and WAL + foreign keys switched on."""
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if str(path) != ":memory:":
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


MIGRATION_LOCK_ID = 0x0DAEDA1
"""PostgreSQL advisory lock key held while migrating."""


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest alembic revision (idempotent, and safe when several processes start at
    once on one store: `daedalus worker --control` and `daedalus api serve` both migrate at start-up)."""
    from alembic import command  # here: a reader that only opens a session does not load alembic
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with _one_migration_at_a_time(engine), engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_ID})
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


@contextmanager
def _one_migration_at_a_time(engine: Engine) -> Iterator[None]:
    """An SQLite file is migrated under an exclusive lock on a sibling file (PostgreSQL uses an advisory lock)."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One transaction: committed on success, rolled back on any error, so nothing is half-written."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
