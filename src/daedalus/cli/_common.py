"""What every CLI command shares: settings, a Temporal client, the store, and errors that end in exit 2."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.config import Settings
from daedalus.decisions.policy import Policy, configured_policy
from daedalus.engines import paths
from daedalus.errors import BadSettings, SetupError, TicketError
from daedalus.escaping import for_terminal
from daedalus.services import connect
from daedalus.store.database import make_engine, migrate

T = TypeVar("T")

# Piped output (CI logs, `make demo | tee`) gets wide tables instead of rich's 80-column fallback.
console = Console(width=None if sys.stdout.isatty() else 160)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def fail(message: str) -> NoReturn:
    errors.print(f"[red]error:[/red] {for_terminal(message)}", highlight=False)
    raise typer.Exit(2)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; a TicketError becomes a clear message and exit code 2."""
    try:
        return asyncio.run(coroutine)
    except TicketError as error:
        fail(str(error))


@functools.cache
def settings() -> Settings:
    """The CLI's one Settings, built on first use from the environment and .env; a bad value ends in exit 2."""
    try:
        built = Settings.load()
    except BadSettings as error:
        fail(str(error))
    paths.configure(built.engines)
    return built


async def client(settings_: Settings | None = None) -> Client:
    temporal = (settings_ or settings()).temporal
    try:
        security = temporal.connection()
    except BadSettings as error:
        fail(str(error))
    return await connect(temporal.target, temporal.namespace, **security)


def store(settings_: Settings | None = None) -> Engine:
    engine = make_engine((settings_ or settings()).store_url)
    migrate(engine)
    return engine


@functools.cache
def policy() -> Policy | None:
    """The server's policy (DAEDALUS_POLICY_FILE), read once; None on a single-user stack that sets none."""
    try:
        return configured_policy(settings().policy_file, settings().hosts_file)
    except SetupError as error:
        fail(str(error))
