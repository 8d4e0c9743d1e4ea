"""The whole embedded stack as `daedalus up` and `make demo` run it: dev server, store, workers."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.config import Settings
from daedalus.devserver import DevServer
from daedalus.hosts.holder import LeaseError, ensure_keeper
from daedalus.hosts.registry import RegistryError, load_registry
from daedalus.ports import free_port
from daedalus.readonly_ui import ReadOnlyUi
from daedalus.services import connect
from daedalus.store.database import make_engine, migrate
from daedalus.worker import WorkerConfig, build_workers

log = structlog.get_logger()
KEEPER_START_S = 15.0


@dataclass
class Stack:
    client: Client
    engine: Engine | None
    settings: Settings
    server: DevServer | None

    @property
    def ui_url(self) -> str | None:
        return f"http://localhost:{self.settings.temporal.ui_port}" if self.server else None


def tools_on_path() -> None:
    """Build and gate commands run `daedalus` and `python`: put this interpreter's bin directory first."""
    bin_dir = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


async def start_lease_keepers(client: Client, settings: Settings) -> None:
    """One lease keeper per host in the registry (already running ones get the current hosts.yaml entry)."""
    try:
        registry = load_registry(settings.hosts_file)
    except RegistryError as error:
        log.warning("no lease keepers: the host registry cannot be read", error=str(error))
        return
    for host in registry.names:
        try:
            await asyncio.wait_for(
                ensure_keeper(client, registry, host, control_queue=settings.temporal.control_queue),
                KEEPER_START_S,
            )
        except (LeaseError, TimeoutError) as error:
            log.warning("lease keeper not started", host=host, error=str(error) or "timed out")
    log.info("lease keepers running", hosts=registry.names)


@asynccontextmanager
async def running_stack(
    settings: Settings, *, hosts: list[str], control: bool = True, embedded: bool | None = None
) -> AsyncIterator[Stack]:
    """Start what is asked for, yield while it runs, and stop all of it (process groups included) on exit."""
    temporal = settings.temporal
    embedded = temporal.address is None if embedded is None else embedded
    server, ui = None, None
    if embedded:
        settings.home.mkdir(parents=True, exist_ok=True)
        # The dev server's own UI listens on an internal port; the public one is the read-only proxy's.
        server = DevServer(
            db_file=settings.home / "temporal.db",
            port=temporal.port,
            ui_port=free_port(),
            log_file=settings.home / "temporal.log",
            synchronous=temporal.sqlite_synchronous,
        )
        await asyncio.to_thread(server.start)
        ui = ReadOnlyUi(upstream_port=server.ui_port or 0, port=temporal.ui_port)
        try:
            await ui.start()
        except BaseException:
            await asyncio.to_thread(server.stop)
            raise
        log.info(
            "temporal dev server started",
            address=server.address,
            ui=f"http://localhost:{temporal.ui_port} (read-only)",
        )
    try:
        client = await connect(temporal.target, temporal.namespace, **temporal.connection())
        engine = None
        if control:
            engine = make_engine(settings.store_url)
            await asyncio.to_thread(migrate, engine)
        tools_on_path()
        config = WorkerConfig.from_settings(settings, hosts)
        workers = build_workers(client, config, engine)
        tasks = [asyncio.create_task(worker.run()) for worker in workers]
        if control:
            await start_lease_keepers(client, settings)
        log.info("workers started", control=control, hosts=hosts, queue=temporal.control_queue)
        try:
            yield Stack(client=client, engine=engine, settings=settings, server=server)
        finally:
            await asyncio.gather(*(worker.shutdown() for worker in workers), return_exceptions=True)
            await asyncio.gather(*tasks, return_exceptions=True)
            if engine is not None:
                engine.dispose()
    finally:
        if ui is not None:
            await ui.stop()
        if server is not None:
            await asyncio.to_thread(server.stop)
