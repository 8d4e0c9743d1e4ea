"""The engine adapter interface and a launched server, shared by llama.cpp and vLLM."""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import httpx
import structlog

from daedalus.engines.metrics import flatten
from daedalus.engines.process import GroupProcess, tail
from daedalus.errors import EngineError, ServerDied
from daedalus.ports import port_in_use
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
                f"last lines of {self.log_path}:\n{tail(self.log_path)}"
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
                        f"{self.log_path}:\n{tail(self.log_path)}"
                    )
                await asyncio.sleep(0.1)

    async def metrics(self) -> dict[str, float]:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.get(self.base_url + "/metrics")
            response.raise_for_status()
            return flatten(response.text)

    def stop(self) -> int | None:
        """Kill the whole process group; returns the leader's exit code."""
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

    def validate(self, model: Path, port: int) -> None:
        """Reject what would fail at launch, before any process exists."""
        if not model.is_file():
            raise EngineError(f"model file {model} does not exist; write one with `daedalus engine model`")
        if port_in_use(port):
            raise EngineError(f"port {port} is in use; pick another port or stop whatever listens there")

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
