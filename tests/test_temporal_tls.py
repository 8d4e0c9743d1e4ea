"""Closing Temporal: with DAEDALUS_TEMPORAL_TLS_* set, Daedalus connects through mutual TLS, and a client
without a certificate the frontend trusts does not get in.

The dev server speaks plain gRPC only, so a TLS terminator that demands a client certificate (as a production
frontend with TEMPORAL_TLS_REQUIRE_CLIENT_AUTH does) stands in front of it, forwarding the bytes unchanged.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from daedalus.config import TemporalSettings
from daedalus.devserver import DevServer
from daedalus.errors import BadSettings
from daedalus.services import RequestRefused, connect

SERVER_NAME = "temporal.daedalus.test"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def mtls_frontend(temporal_server: DevServer, ca: trustme.CA) -> AsyncIterator[str]:
    """A frontend address that accepts only clients with a certificate from `ca`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(SERVER_NAME).configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    host, port = temporal_server.address.rsplit(":", 1)

    async def forward(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(_pipe(client_reader, server_writer), _pipe(server_reader, client_writer))

    server = await asyncio.start_server(forward, "127.0.0.1", 0, ssl=context)
    listening = server.sockets[0].getsockname()
    try:
        yield f"127.0.0.1:{listening[1]}"
    finally:
        server.close()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def _files(tmp_path: Path, name: str, ca: trustme.CA, issuer: trustme.CA) -> TemporalSettings:
    """Settings as the environment would give them: the trusted CA, and a client certificate from `issuer`."""
    directory = tmp_path / name
    directory.mkdir()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    client = issuer.issue_cert("control-worker.daedalus.test")
    client.cert_chain_pems[0].write_to_path(str(directory / "client.pem"))
    client.private_key_pem.write_to_path(str(directory / "client.key"))
    return TemporalSettings(
        tls_server_ca=directory / "ca.pem",
        tls_client_cert=directory / "client.pem",
        tls_client_key=directory / "client.key",
        tls_server_name=SERVER_NAME,
    )


async def test_services_connect_with_their_client_certificate_and_no_one_else_does(
    mtls_frontend: str, ca: trustme.CA, tmp_path: Path
) -> None:
    trusted = _files(tmp_path, "trusted", ca, ca).model_copy(update={"address": mtls_frontend})
    client = await connect(trusted.target, trusted.namespace, **trusted.connection())
    assert (
        await client.count_workflows()
    ).count >= 0  # a real RPC through the mTLS frontend (else it raises)

    rogue = _files(tmp_path, "rogue", ca, trustme.CA()).model_copy(update={"address": mtls_frontend})
    no_cert = trusted.model_copy(update={"tls_client_cert": None, "tls_client_key": None})
    plain = TemporalSettings(address=mtls_frontend)
    for refused in (rogue, no_cert, plain):
        with pytest.raises(RequestRefused, match=f"cannot reach Temporal at {mtls_frontend}"):
            await connect(refused.target, refused.namespace, **refused.connection())


def test_tls_settings_build_the_connection_or_say_what_is_wrong(tmp_path: Path, ca: trustme.CA) -> None:
    assert TemporalSettings().connection() == {"tls": False, "api_key": None}
    assert TemporalSettings(tls=True).connection() == {"tls": True, "api_key": None}
    cloud = TemporalSettings(address="ns.acct.tmprl.cloud:7233", api_key="key-1").connection()  # type: ignore[arg-type]
    assert cloud == {"tls": True, "api_key": "key-1"}
    files = _files(tmp_path, "files", ca, ca).connection()["tls"]
    assert files.client_cert.startswith(b"-----BEGIN CERTIFICATE") and files.domain == SERVER_NAME
    missing = TemporalSettings(tls_server_ca=tmp_path / "nope.pem")
    with pytest.raises(
        BadSettings, match=r"cannot read .*nope.pem, named by DAEDALUS_TEMPORAL_TLS_SERVER_CA"
    ):
        missing.connection()
