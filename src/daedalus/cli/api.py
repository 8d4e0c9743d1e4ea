"""`daedalus api serve`: the HTTP API (tickets, decisions, audit, Slack interactions) under uvicorn."""

from __future__ import annotations

import typer

from daedalus.cli import _common
from daedalus.cli._common import audit_key, client, console, store

app = typer.Typer(help="The HTTP API.", no_args_is_help=True)


@app.callback()
def api() -> None:
    """The HTTP API: tickets, decisions, audit, Slack interactions."""


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="interface to listen on"),
    port: int = typer.Option(8000, help="port to listen on"),
) -> None:
    """Serve the API (docs at /docs). Tokens come from `daedalus token create` (hashed in the store), Slack
    from DAEDALUS_SLACK_*."""
    # FastAPI and uvicorn load here, not at CLI start-up.
    import uvicorn
    from temporalio.client import Client

    from daedalus.api.app import create_app
    from daedalus.store import tokens

    settings = _common.settings()
    engine = store(settings)
    if not tokens.listed(engine):
        console.print(
            "[yellow]no API tokens yet: every endpoint but /docs will answer 401 until an admin runs "
            "`daedalus token create --person <name>`[/yellow]"
        )
    policy = _common.policy()
    if policy is None:
        console.print(
            "[yellow]no DAEDALUS_POLICY_FILE: every token holder's tickets run on the hosts as their specs "
            "say; set a policy for a shared stack (README, Policy)[/yellow]"
        )

    async def connect() -> Client:
        return await client(settings)

    application = create_app(
        engine=engine,
        control_queue=settings.temporal.control_queue,
        client_factory=connect,
        settings=settings.api,
        slack=settings.slack,
        hosts_file=settings.hosts_file,
        policy=policy,
        audit_key=audit_key(),
    )
    console.print(
        f"Daedalus API on http://{host}:{port} (docs at /docs); Temporal at {settings.temporal.target}"
    )
    # uvicorn's own log config writes plain `INFO:     ...` lines: without it, its loggers reach logs.py's renderer.
    uvicorn.run(application, host=host, port=port, log_config=None)
