"""create_app: the FastAPI app. Handlers verify, start or update a ticket's workflow, and return."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi_offline import FastAPIOffline
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus.api import (
    audit,
    decisions,
    hosts,
    identity,
    questions,
    report,
    slack_interactions,
    tickets,
    training,
)
from daedalus.api.console import router as console_router
from daedalus.api.context import ApiContext, ClientFactory
from daedalus.api.errors import validation_handler
from daedalus.api.limits import MAX_BODY_BYTES, BodyLimit
from daedalus.api.settings import ApiSettings
from daedalus.decisions.policy import Policy
from daedalus.slack.settings import SlackSettings
from daedalus.store.seals import AuditKey


def create_app(
    *,
    engine: Engine,
    control_queue: str,
    client: Client | None = None,
    client_factory: ClientFactory | None = None,
    settings: ApiSettings,
    slack: SlackSettings,
    max_body_bytes: int = MAX_BODY_BYTES,
    hosts_file: Path | None = None,
    policy: Policy | None = None,
    audit_key: AuditKey | None = None,
) -> FastAPI:
    """The API over one Temporal client (given, or connected on first use by `client_factory`) and one store;
    its settings come from the entry point (`daedalus api serve` builds them once), and so does the server's
    `policy` (None: a single-user stack, where a spec's own approval rules are trusted). With `hosts_file` (the
    host registry), filing refuses unknown hosts, tickets stuck on a host nobody serves say so, and /hosts
    answers."""
    if (client is None) == (client_factory is None):
        raise ValueError("create_app needs exactly one of `client` and `client_factory`")
    if client is not None:
        connected = client

        async def factory() -> Client:
            return connected

        client_factory = factory
    assert client_factory is not None
    # /docs serves Swagger UI from the fastapi-offline package, so it works with no network. ReDoc is left
    # off: its page fetches its logo from a CDN (the browser tests caught it).
    app = FastAPIOffline(
        redoc_url=None,
        title="Daedalus",
        summary="File tickets, answer decisions and read the audit trail of an ML-inference team's work.",
        version="0.1.0",
    )
    app.state.daedalus = ApiContext(
        engine=engine,
        control_queue=control_queue,
        settings=settings,
        slack=slack,
        client_factory=client_factory,
        hosts_file=hosts_file,
        policy=policy,
        audit_key=audit_key,
    )
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_exception_handler(RequestValidationError, validation_handler)
    for router in (
        identity.router,
        tickets.router,
        hosts.router,
        training.router,
        decisions.router,
        questions.router,
        audit.router,
        report.router,
        slack_interactions.router,
        console_router,
    ):
        app.include_router(router)
    return app
