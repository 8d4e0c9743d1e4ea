"""What every CLI command shares: settings, a Temporal client, the store, and errors that end in exit 2."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import re
import signal
import sys
import threading
from collections.abc import Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console

from daedalus.errors import BadSettings, RegistryError, RequestRefused, SetupError
from daedalus.escaping import for_terminal

# Imported where used: a command loads Temporal's client, the store and the policy only when it needs them
# (`daedalus --help`, a remote `decide` and `ticket list` need none of them, and each costs a second of start-up).
if TYPE_CHECKING:
    from sqlalchemy import Engine
    from temporalio.client import Client

    from daedalus.config import Settings
    from daedalus.decisions.policy import Policy
    from daedalus.hosts.registry import Registry
    from daedalus.hosts.status import TicketOnHost
    from daedalus.store.seals import AuditKey

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def lazy_module(name: str) -> Any:
    """`name`, loaded on its first attribute access (importlib's LazyLoader): a command module names the service
    layer and the store at the top, and only the commands that use them pay for importing them."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


# Piped output (CI logs, `make demo | tee`) gets wide tables instead of rich's 80-column fallback.
console = Console(width=None if sys.stdout.isatty() else 160)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def fail(message: str) -> NoReturn:
    errors.print(f"[red]error:[/red] {for_terminal(message)}", highlight=False)
    raise typer.Exit(2)


STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; a TicketError becomes a clear message and exit code 2. SIGTERM and SIGHUP end it as
    Ctrl-C does (exit 128 + the signal): the coroutine is cancelled, so every `async with` it entered (the
    embedded Temporal, the workers and the steps they run) is left in order and nothing it started outlives it.
    SIGINT does the same when the command was started with it ignored (a background job of a script): Python
    then never turns it into KeyboardInterrupt, and `kill -INT` would go unheard."""
    stopped_by: list[signal.Signals] = []
    sigint_ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    signals = (signal.SIGINT, *STOPPING_SIGNALS) if sigint_ignored else STOPPING_SIGNALS

    async def stoppable() -> T:
        task = asyncio.current_task()
        assert task is not None

        def stop(signum: signal.Signals) -> None:
            stopped_by.append(signum)
            task.cancel()

        if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
            loop = asyncio.get_running_loop()
            for signum in signals:
                loop.add_signal_handler(signum, stop, signum)
        return await coroutine

    try:
        return asyncio.run(stoppable())
    except RequestRefused as error:
        fail(str(error))
    except asyncio.CancelledError:
        if not stopped_by:
            raise
        errors.print(f"stopped by {stopped_by[0].name}")
        raise SystemExit(128 + stopped_by[0]) from None


@functools.cache
def settings() -> Settings:
    """The CLI's one Settings, built on first use from the environment and .env; a bad value ends in exit 2."""
    from daedalus.config import Settings
    from daedalus.engines import paths

    try:
        built = Settings.load()
    except BadSettings as error:
        fail(str(error))
    paths.configure(built.engines)
    return built


async def client(settings_: Settings | None = None) -> Client:
    from daedalus.logs import route_temporal_core
    from daedalus.services._temporal import connect

    route_temporal_core()
    temporal = (settings_ or settings()).temporal
    try:
        security = temporal.connection()
    except BadSettings as error:
        fail(str(error))
    return await connect(temporal.target, temporal.namespace, **security)


def store(settings_: Settings | None = None) -> Engine:
    """The audit store, migrated to the newest revision first when it is not there yet."""
    from daedalus.store.database import make_engine, migrate

    engine = make_engine((settings_ or settings()).store_url)
    if not at_newest_revision(engine):
        migrate(engine)  # alembic loads every migration script: a tenth of a second or more on each command
    return engine


MIGRATIONS = Path(__file__).resolve().parents[1] / "store" / "migrations" / "versions"
_REVISION = re.compile(
    r"""^(down_revision|revision)\s*(?::[^=]*)?=\s*(None|"[^"]*"|'[^']*')\s*$""", re.MULTILINE
)


def newest_revision(versions: Path = MIGRATIONS) -> str | None:
    """The one head of the migration scripts, read from their `revision = "..."` and `down_revision = "..."`
    lines; None when that is not a plain chain (a merge, a branch, a line this cannot read): then migrate."""
    revisions, parents = set(), set()
    for script in versions.glob("*.py"):
        found = dict((name, value.strip("\"'")) for name, value in _REVISION.findall(script.read_text()))
        if "revision" not in found or "down_revision" not in found:
            return None
        revisions.add(found["revision"])
        if found["down_revision"] != "None":
            parents.add(found["down_revision"])
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 and parents <= revisions else None


def at_newest_revision(engine: Engine) -> bool:
    """Whether the store's alembic revision is the scripts' head (an empty or older store: no)."""
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    head = newest_revision()
    if head is None:
        return False
    try:
        with engine.connect() as connection:
            current = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    except SQLAlchemyError:  # no alembic_version table yet: a new store
        return False
    return current == [head]


def audit_key() -> AuditKey:
    """The key this stack's audit events are sealed with (made under home the first time)."""
    try:
        key = settings().audit_key(create=True)
    except SetupError as error:
        fail(str(error))
    assert key is not None
    return key


def registry() -> Registry:
    """The host registry (DAEDALUS_HOSTS_FILE); one that cannot be read ends in exit 2 with what is wrong."""
    from daedalus.hosts.registry import load_registry

    try:
        return load_registry(settings().hosts_file)
    except RegistryError as error:
        fail(str(error))


def waiting_on_hosts(tickets: Sequence[TicketOnHost]) -> dict[str, str]:
    """ticket id -> "queued for host-mavis since 22:03 UTC; no worker polls it; run ..." for tickets stuck on a
    host nobody serves. Empty when the registry or Temporal cannot be read: the listing still shows the rest."""
    from temporalio.service import RPCError

    from daedalus.hosts.registry import load_registry
    from daedalus.hosts.status import ON_A_HOST
    from daedalus.hosts.status import waiting_on_hosts as lines

    if not any(t.status in ON_A_HOST for t in tickets):
        return {}
    try:
        registry = load_registry(settings().hosts_file)
    except RegistryError:
        return {}

    async def ask() -> dict[str, str]:
        return await lines(await client(), registry, tickets, settings().temporal.namespace)

    try:
        return asyncio.run(ask())
    except (RequestRefused, RPCError):
        return {}


@functools.cache
def policy() -> Policy | None:
    """The server's policy (DAEDALUS_POLICY_FILE), read once; None on a single-user stack that sets none."""
    from daedalus.decisions.policy import configured_policy

    try:
        return configured_policy(settings().policy_file, settings().hosts_file)
    except SetupError as error:
        fail(str(error))


def validated(build: type[M], **values: Any) -> M:
    """`build(**values)`; values it refuses end the command (exit 2) with each field and what is wrong with it."""
    try:
        return build(**values)
    except ValidationError as error:
        fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()))


def parse_duration(text: str) -> timedelta | None:
    """`30m`, `2h`, `3d` as a timedelta; None when the text is not such a duration."""
    units = {"m": "minutes", "h": "hours", "d": "days"}
    if text[:-1].isdigit() and text[-1:] in units:
        return timedelta(**{units[text[-1]]: int(text[:-1])})
    return None


def parse_since(text: str) -> datetime:
    duration = parse_duration(text)
    if duration is not None:
        return datetime.now(UTC) - duration
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        fail(f"--since {text!r} is neither an ISO time (2026-07-12T08:00) nor a duration (30m, 2h, 3d)")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
