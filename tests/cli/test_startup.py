"""A decider's commands start without loading what they do not use (bench/cli_startup.py times them).

Each command runs in a child interpreter as `daedalus` runs it (logging configured, the app built with only that
command), against a real Temporal dev server and a real SQLite store, and reports the modules it loaded. The
heavy ones a command has no use for must not be among them: an import added at the top of a shared module shows
up here as the command that started paying for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from alembic.config import Config
from alembic.script import ScriptDirectory

from daedalus.cli._common import MIGRATIONS, at_newest_revision, newest_revision
from daedalus.devserver import DevServer
from daedalus.store.database import make_engine, migrate

CHILD = """
import json, os, sys
arguments = sys.argv[1:]
sys.argv = ["daedalus", *arguments]
from daedalus.logs import configure_logging
configure_logging()
from daedalus.cli import build, invoked
code = 0
try:
    build(invoked(arguments))()
except SystemExit as done:
    code = done.code or 0
sys.stdout.flush()
with open(os.environ["MODULES_OUT"], "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
os._exit(0)
"""

NEVER = ("fastapi", "uvicorn", "alembic", "httpx", "daedalus.api.app", "daedalus.services.decisions",
         "daedalus.services.training", "daedalus.report", "daedalus.engines.measure", "daedalus.gates")  # fmt: skip
"""Loaded by none of these commands on a local stack: the API server, migrations (the store is at its newest
revision), HTTP (no shared stack), the decision desk, training, the report, the engines' measurements, gates."""

COMMANDS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("decide", "--help"): ("temporalio.client", "daedalus.workflows"),
    ("audit", "--help"): ("temporalio.client", "daedalus.workflows"),
    ("ticket", "list"): (
        "temporalio.client",
        "daedalus.workflows",
    ),  # no ticket on a host: nothing to ask Temporal
    ("hosts",): ("daedalus.workflows.ticket", "daedalus.store.database"),
}
"""Arguments -> what that command must not load besides NEVER (a module or any module under it)."""


def loaded(env: dict[str, str], tmp_path: Path, *arguments: str) -> list[str]:
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *arguments],
        env={**env, "MODULES_OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and out.exists(), done.stdout + done.stderr
    found = json.loads(out.read_text())
    assert found["code"] == 0, f"daedalus {' '.join(arguments)} ended with {found['code']}: {done.stderr}"
    modules: list[str] = found["modules"]
    return modules


@pytest.fixture
def local_stack(temporal_server: DevServer, tmp_path: Path) -> dict[str, str]:
    hosts_file = tmp_path / "hosts.yaml"
    hosts_file.write_text(yaml.safe_dump({"hosts": [{"name": "startup-host"}]}))
    home = tmp_path / "home"
    migrate(make_engine(f"sqlite:///{home / 'daedalus.db'}"))  # as `daedalus up` leaves it
    environment = {key: value for key, value in os.environ.items() if not key.startswith("DAEDALUS_API")}
    return {
        **environment,
        "DAEDALUS_HOME": str(home),
        "DAEDALUS_HOSTS_FILE": str(hosts_file),
        "DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address,
        "COLUMNS": "200",
    }


@pytest.mark.parametrize("arguments", list(COMMANDS), ids=" ".join)
def test_a_command_loads_only_what_it_uses(
    local_stack: dict[str, str], tmp_path: Path, arguments: tuple[str, ...]
) -> None:
    modules = loaded(local_stack, tmp_path, *arguments)
    assert "daedalus.config" in modules  # the settings are read, every section validated, on every command
    heavy = sorted(
        module
        for module in modules
        for unwanted in (*NEVER, *COMMANDS[arguments])
        if module == unwanted or module.startswith(unwanted + ".")
    )
    assert heavy == [], f"daedalus {' '.join(arguments)} loaded {heavy}"


def test_the_cli_reads_the_migrations_head_as_alembic_does() -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS.parent))
    assert newest_revision() == ScriptDirectory.from_config(config).get_current_head()


def test_a_store_behind_the_newest_revision_is_migrated_by_a_command(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    assert not at_newest_revision(engine)  # a new store: no alembic_version table yet
    migrate(engine)
    assert at_newest_revision(engine)
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '0001'")
    assert not at_newest_revision(engine)  # so `store()` migrates it before a command reads it


def test_migration_scripts_that_are_not_a_plain_chain_fall_back_to_migrating(tmp_path: Path) -> None:
    for name, revision, down in (("a", "0001", "None"), ("b", "0002", '"0001"'), ("c", "0003", '"0001"')):
        (tmp_path / f"{name}.py").write_text(f'revision = "{revision}"\ndown_revision = {down}\n')
    assert newest_revision(tmp_path) is None  # two heads: alembic decides, not this shortcut
    (tmp_path / "c.py").write_text('revision = "0003"\ndown_revision = "0002"\n')
    assert newest_revision(tmp_path) == "0003"
    (tmp_path / "d.py").write_text("revision = compute()\n")
    assert newest_revision(tmp_path) is None
