"""Several processes starting on one fresh store (the control worker and the API do) migrate it once, safely."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect

from daedalus.store.database import make_engine

MIGRATE = (
    "import sys; from daedalus.store.database import make_engine, migrate; migrate(make_engine(sys.argv[1]))"
)


@pytest.mark.parametrize("round_no", range(3))
def test_four_processes_migrating_one_fresh_sqlite_file_all_succeed(tmp_path: Path, round_no: int) -> None:
    url = f"sqlite:///{tmp_path / f'store-{round_no}.db'}"
    processes = [
        subprocess.Popen([sys.executable, "-c", MIGRATE, url], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    failures = [p.communicate(timeout=120)[1] for p in processes if p.wait(timeout=120) != 0]
    assert not failures, failures[0]
    engine = make_engine(url)
    assert {"audit_events", "tickets"} <= set(inspect(engine).get_table_names())
    engine.dispose()
