"""The engine adapter interface and a launched server, shared by llama.cpp and vLLM."""

from __future__ import annotations

import abc
import asyncio
import http.client
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import httpx
import structlog

from daedalus.engines.engine_processes import GroupProcess
from daedalus.engines.metrics import flatten
from daedalus.engines.openai_api import OpenAIEndpoint
from daedalus.errors import EngineError, EngineSetupError, MetricsUnavailable, ServerDied
from daedalus.ports import port_in_use
from daedalus.processes import log_tail
from daedalus.schemas.engines import LlamaCppPreset, VllmPreset

log = structlog.get_logger(__name__)


class Server:
    """A launched engine server: its process group, log and HTTP endpoint. Use as a context manager."""

    def __init__(self, adapter: EngineAdapter, process: GroupProcess, port: int, model: Path) -> None:
        self.adapter = adapter
        self.process = process
        self.port = port
        self.model = model
        self.base_url = f"http://127.0.0.1:{port}"
        self._endpoint: OpenAIEndpoint | None = None
        self._metrics_conn: http.client.HTTPConnection | None = None
        self._metrics_lock = threading.Lock()

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def check_alive(self) -> None:
        code = self.process.returncode()
        if code is not None:
            raise ServerDied(
                f"{self.adapter.preset.name}: the server exited with code {code}; "
                f"last lines of {self.log_path}:\n{log_tail(self.log_path, lines=30, missing='(no log written)')}"
            )

    async def wait_healthy(self, timeout_s: float = 120.0) -> None:
        """Poll the health endpoint until it answers 200; fail fast if the process dies."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                self.check_alive()
                try:
                    response = await client.get(self.base_url + self.adapter.health_path)
                    if response.status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"{self.adapter.preset.name}: not healthy after {timeout_s:.0f}s; last lines of "
                        f"{self.log_path}:\n{log_tail(self.log_path, lines=30, missing='(no log written)')}"
                    )
                await asyncio.sleep(0.1)

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        """One health check: the process is up and its health endpoint answers 200."""
        if self.process.returncode() is not None:
            return False
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as client:
                response = await client.get(self.base_url + self.adapter.health_path)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def endpoint(self, timeout_s: float = 120.0) -> OpenAIEndpoint:
        """The server's OpenAI-compatible API, with what this engine needs in every request body."""
        if self._endpoint is None or self._endpoint.timeout_s != timeout_s:
            self._endpoint = OpenAIEndpoint(
                self.base_url, extra=self.adapter.request_extras(), timeout_s=timeout_s
            )
        return self._endpoint

    def metrics_text(self) -> str:
        """/metrics over one kept-alive connection: a poll costs a request, not a new client (a new
        httpx.AsyncClient cost ~40 ms of CPU, on every 0.5 s poll)."""
        with self._metrics_lock:
            for attempt in (0, 1):
                if self._metrics_conn is None:
                    self._metrics_conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10.0)
                try:
                    self._metrics_conn.request("GET", "/metrics")
                    response = self._metrics_conn.getresponse()
                    body = response.read().decode(errors="replace")
                except (OSError, http.client.HTTPException) as exc:
                    self._metrics_conn.close()
                    self._metrics_conn = None
                    if attempt:  # the kept-alive connection may have been closed by the server: retry once
                        raise MetricsUnavailable(
                            f"{self.base_url}/metrics: {type(exc).__name__}: {exc}"
                        ) from exc
                    continue
                if response.status != 200:
                    raise MetricsUnavailable(
                        f"{self.base_url}/metrics answered {response.status}: {body[:200]}"
                    )
                return body
        raise AssertionError("unreachable")

    async def metrics(self) -> dict[str, float]:
        return flatten(await asyncio.to_thread(self.metrics_text))

    def stop(self) -> int | None:
        """Kill the whole process group; returns the leader's exit code."""
        if self._metrics_conn is not None:
            self._metrics_conn.close()
            self._metrics_conn = None
        return self.process.stop()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)


class EngineAdapter(abc.ABC):
    """Build, launch with a preset, wait for health, stop, and read capacity."""

    health_path = "/health"
    preset: LlamaCppPreset | VllmPreset

    @abc.abstractmethod
    def command(self, model: Path, port: int) -> list[str]:
        """The server's argv for this preset."""

    @abc.abstractmethod
    def environment(self) -> Mapping[str, str]:
        """Extra environment for the server process."""

    def request_extras(self) -> dict[str, object]:
        """Fields this engine needs in every OpenAI-compatible request body (none by default)."""
        return {}

    def validate(self, model: Path, port: int) -> None:
        """Reject what would fail at launch, before any process exists."""
        if not model.is_file():
            raise EngineSetupError(
                f"model file {model} does not exist; write one with `daedalus engine model`"
            )
        if port_in_use(port):
            raise EngineSetupError(f"port {port} is in use; pick another port or stop whatever listens there")

    async def launch(
        self,
        model: Path,
        port: int,
        log_path: Path,
        *,
        timeout_s: float = 120.0,
        memory_limit_bytes: int | None = None,
    ) -> Server:
        """Start the server and wait until it is healthy; on failure nothing is left running."""
        self.validate(model, port)
        process = GroupProcess(self.command(model, port), log_path, self.environment(), memory_limit_bytes)
        process.start()
        server = Server(self, process, port, model)
        try:
            await server.wait_healthy(timeout_s)
        except BaseException:
            await asyncio.to_thread(server.stop)
            raise
        log.info("engine.healthy", preset=self.preset.name, url=server.base_url, pid=process.pid)
        return server
