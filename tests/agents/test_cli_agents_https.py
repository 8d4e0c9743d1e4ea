"""The production path: a provider over HTTPS, reached through the egress gateway's CONNECT proxy. The local
model server serves TLS for `localhost` with a certificate from a test CA the CLI is told to trust; the real
CLI sends its requests through HTTPS_PROXY, the gateway admits only that host and port, and TLS runs end to end
from the CLI to the server (the gateway sees only the tunnel)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from daedalus.agents.cli import EGRESS_FILE
from daedalus.agents.model_server import ModelServer
from daedalus.schemas.agents import ExitReason
from tests.agents.clis import cli_settings, egress_decisions, new_key, the_change
from tests.agents.conftest import Beats, MakeTask
from tests.agents.test_cli_agents import AGENTS

# Claude Code (Bun) adds NODE_EXTRA_CA_CERTS to its roots; the Codex CLI reads SSL_CERT_FILE.
CA_VARIABLES = ["NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE"]


@pytest.fixture(scope="module")
def https_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModelServer, Path]]:
    where = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    issued = ca.issue_cert("localhost")
    chain, key, root = where / "chain.pem", where / "key.pem", where / "ca.pem"
    issued.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    ca.cert_pem.write_to_path(str(root))
    with ModelServer(tls=(chain, key)) as server:
        yield server, root


@pytest.mark.parametrize("name", ["codex", "claude"])
async def test_the_cli_reaches_an_https_provider_through_the_connect_proxy_only(
    name: str,
    https_server: tuple[ModelServer, Path],
    make_task: MakeTask,
    artifacts: Path,
    beats: Beats,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, ca = https_server
    for variable in CA_VARIABLES:
        monkeypatch.setenv(variable, str(ca))
    key = new_key()
    script = server.add(key, the_change(name))
    settings = cli_settings(server, key, sandbox_read_only=[str(ca)], sandbox_pass_env=CA_VARIABLES)
    task = make_task({"name": name})
    result = await AGENTS[name](settings).run(task, artifacts=artifacts, heartbeat=beats)
    assert result.exit_reason is ExitReason.COMMITTED, result.detail
    assert (Path(task.worktree) / "speed.txt").read_text() == "56.0\n"
    assert script.requests == len(script.steps)
    decisions = egress_decisions(artifacts)
    allowed = {(d["route"], d["target"]) for d in decisions if d["allowed"]}
    assert allowed == {("proxy", f"localhost:{server.port}")}
    assert all(d["route"] == "proxy" for d in decisions), "an HTTPS endpoint has no relay: only the proxy"
    recorded = json.loads((artifacts / EGRESS_FILE).read_text())
    assert recorded["base_url"] == recorded["endpoint"] == (server.url + ("/v1" if name == "codex" else ""))
