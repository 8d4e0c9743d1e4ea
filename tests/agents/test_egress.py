"""Egress of a networked agent's sandbox: its own loopback only, and a gateway that admits the model endpoint.

A shell in the same sandbox the CLI agents get (bubblewrap with `--unshare-net`, the forwarder inside, the
gateway outside) tries everything on the host's loopback and outside; only the allowed endpoint answers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from daedalus import egress as egress_module
from daedalus.agents.model_server import ModelScript, ModelServer, Reply
from daedalus.devserver import DevServer
from daedalus.egress import PROXY_PORT, RELAY_PORT, Egress, EgressPlan, Endpoint, Gateway, Route, plan_for
from daedalus.errors import SandboxError
from daedalus.sandbox import Sandbox
from tests.agents.clis import egress_decisions

# Runs inside the sandbox (the system python3): one line per probe, "<name> <outcome>".
PROBE = r"""
import socket, sys
def connect(host, port):
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect((host, port)); return s
    except OSError as e:
        print(f"{name} {type(e).__name__}"); return None
def ask(sock, head):
    sock.sendall(head); data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk: break
        data += chunk
    return data.split(b"\r\n")[0].decode()
for probe in sys.argv[1:]:
    name, kind, host, port, *rest = probe.split(",")
    s = connect(host, int(port))
    if s is None: continue
    if kind == "http":
        print(name, ask(s, f"GET /api/hello HTTP/1.1\r\nHost: x\r\n\r\n".encode()))
    elif kind == "connect":
        line = ask(s, f"CONNECT {rest[0]} HTTP/1.1\r\nHost: {rest[0]}\r\n\r\n".encode())
        if line.endswith("200 Connection established"):
            line += " | " + ask(s, b"GET /api/hello HTTP/1.1\r\nHost: x\r\n\r\n")
        print(name, line)
    elif kind == "absolute":
        print(name, ask(s, f"GET http://{rest[0]}/ HTTP/1.1\r\nHost: {rest[0]}\r\n\r\n".encode()))
"""


def probe(tmp_path: Path, plan: EgressPlan, *probes: str) -> dict[str, str]:
    worktree = tmp_path / "wt"
    worktree.mkdir(exist_ok=True)
    egress = Egress.create(plan, tmp_path / "egress.log")
    sandbox = Sandbox.for_worktree(worktree, read_only=egress.read_only, env=plan.env)
    command = egress.outer(sandbox.argv(egress.inner(["/usr/bin/python3", "-c", PROBE, *probes])))
    done = subprocess.run(command, env=sandbox.environment("egress-test"), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert not egress.directory.exists(), "the gateway removes its sockets when the sandbox ends"
    return dict(line.split(" ", 1) for line in done.stdout.decode().splitlines())


def port_of(server: DevServer) -> int:
    return int(server.address.rpartition(":")[2])


def test_a_plain_http_endpoint_is_relayed_and_nothing_else_is_reachable(
    tmp_path: Path, model_server: ModelServer, temporal_server: DevServer
) -> None:
    with ModelServer() as other:  # another server on the host's loopback, as the API would be
        plan = plan_for(f"{model_server.url}/v1")
        assert plan.base_url == f"{model_server.url}/v1", "a loopback endpoint keeps its URL inside"
        seen = probe(
            tmp_path,
            plan,
            f"model,http,127.0.0.1,{model_server.port}",
            f"temporal,http,127.0.0.1,{port_of(temporal_server)}",
            f"api,http,127.0.0.1,{other.port}",
            "outside,http,1.1.1.1,443",
            f"proxy-temporal,connect,127.0.0.1,{PROXY_PORT},127.0.0.1:{port_of(temporal_server)}",
            f"proxy-model,connect,127.0.0.1,{PROXY_PORT},127.0.0.1:{model_server.port}",
        )
        assert not other.arrivals
    assert (
        seen
        == {
            "model": "HTTP/1.1 200 OK",
            "temporal": "ConnectionRefusedError",
            "api": "ConnectionRefusedError",
            "outside": "OSError",
            "proxy-temporal": "HTTP/1.1 403 Forbidden",
            "proxy-model": "HTTP/1.1 403 Forbidden",  # the relay is its one way to the model; the proxy admits none
        }
    )
    decisions = egress_decisions(tmp_path)
    assert [(d["route"], d["target"], d["allowed"]) for d in decisions] == [
        ("relay", f"127.0.0.1:{model_server.port}", True),
        ("proxy", f"127.0.0.1:{port_of(temporal_server)}", False),
        ("proxy", f"127.0.0.1:{model_server.port}", False),
    ]


def test_an_https_endpoint_is_a_connect_proxy_admitting_that_host_and_port_only(
    tmp_path: Path, model_server: ModelServer, temporal_server: DevServer
) -> None:
    # The tunnel carries whatever the client speaks (TLS to a real provider); plain HTTP shows it works here.
    allowed = f"localhost:{model_server.port}"
    plan = plan_for(f"https://{allowed}")
    assert plan.tls and plan.env["HTTPS_PROXY"] == f"http://127.0.0.1:{PROXY_PORT}"
    model_server.add("egress", ModelScript.of(Reply("x")))
    seen = probe(
        tmp_path,
        plan,
        f"allowed,connect,127.0.0.1,{PROXY_PORT},{allowed}",
        f"allowed-caps,connect,127.0.0.1,{PROXY_PORT},LOCALHOST:{model_server.port}",
        f"other-port,connect,127.0.0.1,{PROXY_PORT},localhost:{port_of(temporal_server)}",
        f"other-host,connect,127.0.0.1,{PROXY_PORT},127.0.0.1:{model_server.port}",
        f"absolute,absolute,127.0.0.1,{PROXY_PORT},{allowed}",
        f"direct,http,127.0.0.1,{model_server.port}",
    )
    assert seen == {
        "allowed": "HTTP/1.1 200 Connection established | HTTP/1.1 200 OK",
        "allowed-caps": "HTTP/1.1 200 Connection established | HTTP/1.1 200 OK",
        "other-port": "HTTP/1.1 403 Forbidden",
        "other-host": "HTTP/1.1 403 Forbidden",
        "absolute": "HTTP/1.1 403 Forbidden",
        "direct": "ConnectionRefusedError",
    }
    refused = [d for d in egress_decisions(tmp_path) if not d["allowed"]]
    assert {d["target"] for d in refused} == {
        f"localhost:{port_of(temporal_server)}",
        f"127.0.0.1:{model_server.port}",
        f"http://{allowed}/",
    }


def test_plans_for_each_kind_of_endpoint() -> None:
    remote = plan_for("http://10.0.0.5:80/v1")
    assert remote.base_url == f"http://127.0.0.1:{RELAY_PORT}/v1"
    assert remote.routes[0] == Route(RELAY_PORT, upstream=Endpoint("10.0.0.5", 80))
    assert remote.routes[1] == Route(PROXY_PORT), "everything else asks a proxy that admits nothing"
    provider = plan_for("https://api.anthropic.com")
    assert provider.base_url == "https://api.anthropic.com"
    assert provider.routes == (Route(PROXY_PORT, allowed=(Endpoint("api.anthropic.com", 443),)),)
    for bad in ("api.openai.com/v1", "ftp://x", "http://"):
        with pytest.raises(SandboxError, match="not an http"):
            plan_for(bad)


async def test_the_gateway_alone_decides_whatever_reaches_its_socket(
    tmp_path: Path, model_server: ModelServer
) -> None:
    """The forwarder inside the sandbox decides nothing: a client on the gateway's socket itself (an agent that
    replaced the forwarder) gets the same answers."""
    allowed = Endpoint("127.0.0.1", model_server.port)
    gateway = Gateway([Route(PROXY_PORT, allowed=(allowed,))], tmp_path, tmp_path / "egress.log")
    await gateway.start()
    try:
        answers = []
        for target in (str(allowed), "127.0.0.1:22", f"127.0.0.1:{model_server.port}0"):
            reader, writer = await asyncio.open_unix_connection(str(tmp_path / "r0.sock"))
            writer.write(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
            answers.append((await reader.readline()).decode().strip())
            writer.close()
    finally:
        await gateway.close()
    assert answers == [
        "HTTP/1.1 200 Connection established",
        "HTTP/1.1 403 Forbidden",
        "HTTP/1.1 403 Forbidden",
    ]


def test_the_gateway_ends_with_its_command_and_says_what_it_needs(tmp_path: Path) -> None:
    directory = tmp_path / "sockets"
    gateway = [sys.executable, "-I", "-S", egress_module.__file__, "--dir", str(directory), "--routes", "[]"]
    done = subprocess.run([*gateway, "--", sys.executable, "-c", "raise SystemExit(7)"], timeout=60)
    assert done.returncode == 7 and not directory.exists()
    bad = subprocess.run(gateway, capture_output=True, timeout=60)
    assert bad.returncode == 2 and b"give the command to run after --" in bad.stderr
