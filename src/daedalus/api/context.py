"""What every request handler needs: the Temporal client, the store, the settings, the caller."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.api.settings import ApiSettings
from daedalus.decisions.policy import Policy
from daedalus.errors import RegistryError, RequestRefused
from daedalus.hosts.registry import Registry, load_registry
from daedalus.slack.settings import SlackSettings
from daedalus.store import tokens
from daedalus.store.seals import AuditKey

ClientFactory = Callable[[], Awaitable[Client]]


@dataclass
class ApiContext:
    engine: Engine
    control_queue: str
    settings: ApiSettings
    slack: SlackSettings
    client_factory: ClientFactory
    hosts_file: Path | None = None
    policy: Policy | None = None
    audit_key: AuditKey | None = None
    _client: Client | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def require_audit_key(self) -> AuditKey:
        """The key a route that writes audit events seals them with; 503 where the API was started without."""
        if self.audit_key is None:
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                "this API was started without the audit key, so it cannot write audit events; start it with "
                "DAEDALUS_AUDIT_KEY (or DAEDALUS_AUDIT_KEY_FILE) set as the control worker's",
            )
        return self.audit_key

    async def client(self) -> Client:
        """Connect once, on first use (ASGI lifespan does not run under every server or test transport)."""
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    try:
                        self._client = await self.client_factory()
                    except RequestRefused as error:
                        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from error
        return self._client

    def registry(self) -> Registry:
        """The host registry, read on each request (hosts.yaml may change while the API runs); 503 without one."""
        if self.hosts_file is None:
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                "this API has no host registry; start it with DAEDALUS_HOSTS_FILE set to your hosts.yaml",
            )
        try:
            return load_registry(self.hosts_file)
        except RegistryError as error:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from error


def get_context(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.daedalus
    return context


async def get_client(context: Annotated[ApiContext, Depends(get_context)]) -> Client:
    return await context.client()


bearer = HTTPBearer(auto_error=False, description="a token from `daedalus token create`")


def get_caller(
    context: Annotated[ApiContext, Depends(get_context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> str:
    """The person behind the bearer token; 401 without a valid one. (A sync dependency: FastAPI runs it in
    its thread pool, so the store read does not block the event loop.)"""
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "send `Authorization: Bearer <token>`; an admin issues tokens with `daedalus token create`",
            headers=challenge,
        )
    found = tokens.identify(context.engine, credentials.credentials)
    if isinstance(found, tokens.Refusal):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, found.value, headers=challenge)
    return found


Context = Annotated[ApiContext, Depends(get_context)]
TemporalClient = Annotated[Client, Depends(get_client)]
Caller = Annotated[str, Depends(get_caller)]


def require_same_person(caller: str, claimed: str, field_name: str) -> None:
    """A request may act only as the person its token belongs to."""
    if claimed.lower() != caller:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"{field_name} is {claimed!r} but your token belongs to {caller!r}; "
            f"you can act only as yourself (delegate to let someone decide for you)",
        )
