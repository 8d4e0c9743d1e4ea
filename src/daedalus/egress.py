"""Egress for networked agents: a sandbox with no network of its own reaches its model endpoint and nothing else.

The codex and claude agents call their model themselves, so their sandbox needs one way out. It does not get
the host's network (which reaches the loopback Temporal frontend, its UI, the API, every local port). Instead:

* the sandbox keeps its own network namespace (`bwrap --unshare-net`: a loopback of its own, nothing else);
* inside it, `egress_forward.py` (run by the system's python3) listens on 127.0.0.1:<port> and relays each
  connection to a Unix socket bound read-only into the sandbox;
* on the host, the gateway here serves those sockets and opens a connection only to the allowed endpoint:
  a *relay* route goes to its one upstream (a plain-HTTP endpoint, such as the local model server; the CLI's
  base URL points at the sandbox's own 127.0.0.1:<port>), a *proxy* route is an HTTP CONNECT proxy that admits
  only the allowed host:port (an HTTPS provider; the CLI gets HTTPS_PROXY and TLS stays end to end).

Every decision is a JSON line in the attempt's `egress.log` (allowed or refused, and the target asked for).
The gateway runs as the parent of the sandbox (`python -S egress.py ... -- bwrap ...`), so it lives exactly
as long as the agent, carries the step's token, and a worker that restarts finds the agent still able to work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

FORWARDER = Path(__file__).with_name("egress_forward.py")
SYSTEM_PYTHON = Path("/usr/bin/python3")
PROXY_PORT = 3128
"""Where a proxy route listens inside the sandbox."""
RELAY_PORT = 18080
"""Where a relay route listens inside the sandbox when its upstream's port cannot be reused (below 1024)."""
HEAD_LIMIT = 16384
"""The longest CONNECT request head the gateway reads."""
TLS_ROOTS = ("/etc/ssl", "/etc/ca-certificates", "/usr/share/ca-certificates")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Route:
    """One way out: the sandbox connects to its own 127.0.0.1:`port`; the gateway relays that to `upstream`, or,
    when `upstream` is None, acts as a CONNECT proxy admitting only `allowed`."""

    port: int
    upstream: Endpoint | None = None
    allowed: tuple[Endpoint, ...] = ()

    @property
    def kind(self) -> str:
        return "relay" if self.upstream is not None else "proxy"


@dataclass(frozen=True)
class EgressPlan:
    """How one agent reaches its endpoint: the routes, the URL it must use inside the sandbox, its proxy
    variables, and whether it needs TLS roots (an HTTPS endpoint)."""

    routes: tuple[Route, ...]
    base_url: str
    env: dict[str, str] = field(default_factory=dict)
    tls: bool = False


def plan_for(url: str) -> EgressPlan:
    """The egress that lets a sandboxed program reach `url` (an http or https base URL) and nothing else."""
    from daedalus.errors import SandboxError  # here, not above: the gateway's start must not pay for it

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SandboxError(
            f"agent endpoint {url!r} is not an http(s) URL with a host; set the provider's base URL to e.g. "
            "https://api.anthropic.com or http://10.0.0.5:8000/v1"
        )
    default = 443 if parts.scheme == "https" else 80
    upstream = Endpoint(parts.hostname, parts.port or default)
    proxy = f"http://127.0.0.1:{PROXY_PORT}"
    # Every client that honours the proxy variables asks the gateway for anything else it wants to reach: the
    # gateway refuses at once and logs it (without them, a name lookup with no resolver waits out its timeout).
    env = {"HTTPS_PROXY": proxy, "https_proxy": proxy, "HTTP_PROXY": proxy, "http_proxy": proxy}
    if parts.scheme == "https":
        route = Route(PROXY_PORT, allowed=(upstream,))
        return EgressPlan((route,), url, {**env, "NO_PROXY": "", "no_proxy": ""}, tls=True)
    inner = upstream.port if upstream.port >= 1024 and upstream.port != PROXY_PORT else RELAY_PORT
    netloc = f"127.0.0.1:{inner}"
    if parts.username or parts.password:
        netloc = f"{parts.netloc.rpartition('@')[0]}@{netloc}"
    base = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    direct = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    return EgressPlan((Route(inner, upstream=upstream), Route(PROXY_PORT)), base, {**env, **direct})


@dataclass(frozen=True)
class Egress:
    """A plan made concrete for one run: the directory of its sockets (bound read-only into the sandbox), the
    gateway wrapped around the sandbox's command, and the forwarder inside it."""

    plan: EgressPlan
    directory: Path
    log: Path

    @classmethod
    def create(cls, plan: EgressPlan, log: Path) -> Egress:
        if not SYSTEM_PYTHON.exists():
            from daedalus.errors import SandboxError

            raise SandboxError(
                f"an agent's egress needs {SYSTEM_PYTHON} inside its sandbox (it runs the forwarder); "
                "install it with `apt-get install python3-minimal`"
            )
        # Unix socket paths are short (108 bytes): a directory of its own under /tmp, not the artifacts.
        directory = Path(tempfile.mkdtemp(prefix="daedalus-egress-"))
        return cls(plan, directory, log)

    def socket(self, index: int) -> Path:
        return self.directory / f"r{index}.sock"

    @property
    def read_only(self) -> list[Path]:
        """What the sandbox must see: the sockets, the forwarder, and for HTTPS the TLS roots."""
        roots = [Path(p) for p in TLS_ROOTS if Path(p).exists()] if self.plan.tls else []
        return [self.directory, FORWARDER, *roots]

    def inner(self, command: Sequence[str]) -> list[str]:
        """`command` as run inside the sandbox: behind the forwarder."""
        pairs = [f"{route.port}={self.socket(i)}" for i, route in enumerate(self.plan.routes)]
        return [str(SYSTEM_PYTHON), "-I", "-S", str(FORWARDER), *pairs, "--", *command]

    def outer(self, sandboxed: Sequence[str]) -> list[str]:
        """The sandbox's command line, as run on the host: under the gateway."""
        routes = json.dumps([asdict(route) for route in self.plan.routes])
        # This file as a script, without site-packages (-S): it imports the standard library only, and a gateway
        # starts for every agent (-S alone saves about a third of its start on a busy host).
        gateway = [sys.executable, "-I", "-S", __file__, "--dir", str(self.directory)]
        return [*gateway, "--log", str(self.log), "--routes", routes, "--", *sandboxed]

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


# ---- the gateway (host side) ----------------------------------------------------------------------------------


class Gateway:
    """Serves one Unix socket per route; opens a connection out only where the route allows."""

    def __init__(self, routes: Sequence[Route], directory: Path, log: Path | None):
        self.routes = list(routes)
        self.directory = directory
        self.log = log
        self.servers: list[asyncio.AbstractServer] = []

    async def start(self) -> None:
        for index, route in enumerate(self.routes):
            path = self.directory / f"r{index}.sock"
            path.unlink(missing_ok=True)

            async def handle(
                reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: Route = route
            ) -> None:
                with contextlib.suppress(Exception):
                    if route.upstream is not None:
                        await self._relay(reader, writer, route.upstream, route)
                    else:
                        await self._proxy(reader, writer, route)
                with contextlib.suppress(Exception):
                    writer.close()

            self.servers.append(await asyncio.start_unix_server(handle, path=str(path), limit=HEAD_LIMIT))
            path.chmod(0o666)  # the sandbox's user namespace may map its user to another uid

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    def _note(self, route: Route, target: str, allowed: bool, reason: str = "") -> None:
        if self.log is None:
            return
        entry = {"at": round(time.time(), 3), "route": route.kind, "target": target, "allowed": allowed}
        if reason:
            entry["reason"] = reason
        with self.log.open("a") as out:
            out.write(json.dumps(entry) + "\n")

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: Endpoint,
        route: Route,
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(upstream.host, upstream.port), timeout=30
            )
        except (OSError, TimeoutError) as error:
            self._note(route, str(upstream), False, f"upstream unreachable: {error}")
            if route.upstream is None:
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
            return
        self._note(route, str(upstream), True)
        if route.upstream is None:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: Route) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            self._note(route, "?", False, "no complete request head")
            return
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        method, _, rest = line.partition(" ")
        target = rest.rpartition(" ")[0] or rest
        if method.upper() != "CONNECT":
            self._note(route, target, False, f"{method} is not CONNECT")
            await _refuse(writer, f"only CONNECT to {', '.join(map(str, route.allowed))} leaves this sandbox")
            return
        host, _, port = target.rpartition(":")
        host = host.strip("[]").lower()
        wanted = Endpoint(host, int(port)) if port.isdigit() else None
        if wanted is None or wanted not in route.allowed:
            self._note(route, target, False, "not on the allow-list")
            await _refuse(writer, f"{target} is not on this sandbox's allow-list")
            return
        await self._relay(reader, writer, wanted, route)


async def _refuse(writer: asyncio.StreamWriter, why: str) -> None:
    body = why.encode() + b"\n"
    writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\n")
    writer.write(f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
    await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


async def run_under_gateway(
    routes: Sequence[Route], directory: Path, log: Path | None, command: list[str]
) -> int:
    """Serve the routes while `command` (the sandbox) runs; its exit status is ours."""
    gateway = Gateway(routes, directory, log)
    await gateway.start()
    child = await asyncio.create_subprocess_exec(*command)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, _forward, child, sig)
    try:
        code = await child.wait()
    finally:
        await gateway.close()
        shutil.rmtree(directory, ignore_errors=True)
    return code if code >= 0 else 128 - code


def _forward(child: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(sig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -S egress.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="where the routes' Unix sockets go")
    parser.add_argument("--log", type=Path, help="append every decision here, one JSON line each")
    parser.add_argument("--routes", required=True, help="JSON list of routes (port, upstream, allowed)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the sandbox's command line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    routes = [
        Route(
            port=int(r["port"]),
            upstream=Endpoint(**r["upstream"]) if r.get("upstream") else None,
            allowed=tuple(Endpoint(**a) for a in r.get("allowed") or ()),
        )
        for r in json.loads(args.routes)
    ]
    args.dir.mkdir(parents=True, exist_ok=True)
    os.umask(0o022)
    return asyncio.run(run_under_gateway(routes, args.dir, args.log, command))


if __name__ == "__main__":
    sys.exit(main())
