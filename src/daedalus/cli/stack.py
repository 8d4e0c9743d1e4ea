"""`daedalus up` and `daedalus worker`: run the stack, or one part of it, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated

import structlog
import typer

from daedalus.cli import _common
from daedalus.cli._common import console, fail, run
from daedalus.config import Settings
from daedalus.errors import BadSettings, DevServerError

log = structlog.get_logger()

STACK_STOPPING_SIGNALS = (signal.SIGINT, *_common.STOPPING_SIGNALS)
"""Every command stops on SIGTERM and SIGHUP as on Ctrl-C (`_common.run`); a running stack takes SIGINT itself."""


def stop_on_signals(stop: asyncio.Event) -> None:
    """Ctrl-C (SIGINT), SIGTERM (systemd, docker stop, kill) and SIGHUP all stop the stack: the first one sets
    `stop`, and leaving the running stack shuts the workers down and stops the embedded server, which would
    otherwise outlive us; a second one interrupts that stop (KeyboardInterrupt, as a second Ctrl-C always did).
    Installed before anything starts, so a signal during start-up also ends in a clean stop.

    SIGINT is taken here even when this process was started with it ignored, as a background job of a
    non-interactive shell is: Python then never turns it into KeyboardInterrupt, and `kill -INT` left the workers
    running for good (a CI run under `... &` hung every test that stops a `daedalus worker` this way)."""

    def on_signal(signum: signal.Signals) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        log.info("stopping", signal=signum.name)
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in STACK_STOPPING_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)


async def _serve_forever(settings: Settings, hosts: list[str], control: bool, embedded: bool) -> None:
    # Workers pull in every activity's libraries: load them only here.
    from daedalus.logs import route_temporal_core
    from daedalus.stack import running_stack
    from daedalus.worker import settle_heap

    route_temporal_core()  # before the first connection: the workers' poll retries are log records too
    stop = asyncio.Event()
    stop_on_signals(stop)
    async with running_stack(settings, hosts=hosts, control=control, embedded=embedded) as stack:
        settle_heap()
        if stack.ui_url:
            console.print(f"Temporal UI: [bold]{stack.ui_url}[/bold]  (Ctrl-C or SIGTERM stops everything)")
        console.print(
            f"Temporal at {settings.temporal.target}; control queue {settings.temporal.control_queue}; "
            f"hosts {hosts}"
        )
        await stop.wait()
    console.print("stopped")


def _run_until_interrupted(settings: Settings, hosts: list[str], control: bool, embedded: bool) -> None:
    try:
        run(_serve_forever(settings, hosts, control, embedded))
    except KeyboardInterrupt:
        console.print("stopped")
    except (DevServerError, BadSettings) as error:
        fail(str(error))


def up(
    temporal_address: Annotated[
        str | None, typer.Option(help="use this Temporal cluster instead of starting the embedded one")
    ] = None,
    host: Annotated[list[str] | None, typer.Option(help="GPU hosts whose queues this machine serves")] = None,
) -> None:
    """Start the embedded Temporal (SQLite under .daedalus/, UI on :8233), the store and the workers."""
    settings = _common.settings()
    if temporal_address:
        temporal = settings.temporal.model_copy(update={"address": temporal_address})
        settings = settings.model_copy(update={"temporal": temporal})
    _run_until_interrupted(settings, host or [settings.host], control=True, embedded=temporal_address is None)


def worker(
    host: Annotated[list[str] | None, typer.Option(help="serve host-<NAME> (repeatable)")] = None,
    control: Annotated[bool, typer.Option(help="also run the control queue (workflows, store)")] = False,
    check: Annotated[
        bool, typer.Option(help="check each host first (`daedalus host check`); poll only those that pass")
    ] = True,
) -> None:
    """Run workers against an already running Temporal (DAEDALUS_TEMPORAL_ADDRESS or 127.0.0.1:7233)."""
    settings = _common.settings()
    if not host and not control:
        fail("nothing to run: pass --host NAME for a GPU host's queue and/or --control for the control queue")
    hosts = host or []
    if check and hosts:
        from daedalus.cli.host_check import serveable

        hosts = serveable(settings, hosts)
        if not hosts and not control:
            fail("no host passed its check: nothing to poll")
    _run_until_interrupted(settings, hosts, control=control, embedded=False)
