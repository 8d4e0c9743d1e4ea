"""The `daedalus` command: one typer app, one sub-app per domain.

A command's module is imported only when that command runs: `daedalus decide` loads the ticket commands, not
the engines, the report's plotting libraries or the API server, so a decider clearing a queue does not pay for
them on each answer. `daedalus --help` (or no command) builds the whole app; so does importing `app`.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer

HELP = "Durable, auditable tickets for an ML-inference team, on Temporal."


@dataclass(frozen=True)
class Entry:
    """One top-level command: `module.attribute`, a command function or a sub-app."""

    name: str
    module: str
    attribute: str
    sub_app: bool


ENTRIES = (
    Entry("up", "stack", "up", sub_app=False),
    Entry("worker", "stack", "worker", sub_app=False),
    Entry("decide", "decisions", "decide", sub_app=False),
    Entry("delegate", "decisions", "delegate", sub_app=False),
    Entry("audit", "audit", "audit_app", sub_app=True),
    Entry("report", "reports", "report", sub_app=False),
    Entry("report-schedule", "reports", "report_schedule", sub_app=False),
    Entry("demo", "demo", "demo", sub_app=False),
    Entry("ticket", "tickets", "app", sub_app=True),
    Entry("engine", "engines", "app", sub_app=True),
    Entry("train", "training", "app", sub_app=True),
    Entry("api", "api", "app", sub_app=True),
    Entry("token", "tokens", "app", sub_app=True),
    Entry("hosts", "hosts", "app", sub_app=True),
    Entry("host", "host_bundle", "app", sub_app=True),
    Entry("lessons", "lessons", "app", sub_app=True),
    Entry("campaign", "campaigns", "app", sub_app=True),
    Entry("verdict", "verdicts", "app", sub_app=True),
    Entry("question", "questions", "app", sub_app=True),
    Entry("rulings", "questions", "rulings", sub_app=False),
)
NAMES = frozenset(entry.name for entry in ENTRIES)


def build(only: str | None = None) -> typer.Typer:
    """The app with every command, or with only the command `only` (the one being run)."""
    import typer

    from daedalus.cli._common import settings

    app = typer.Typer(name="daedalus", help=HELP, no_args_is_help=True, add_completion=False)

    @app.callback()
    def _settings() -> None:
        """Durable, auditable tickets for an ML-inference team, on Temporal."""
        settings.cache_clear()  # built afresh for each invocation (in-process runners invoke the app many times)
        settings()  # once, before any command: a bad DAEDALUS_* value stops here with its name

    for entry in ENTRIES:
        if only is not None and entry.name != only:
            continue
        found = getattr(importlib.import_module(f"daedalus.cli.{entry.module}"), entry.attribute)
        if entry.sub_app:
            app.add_typer(found, name=entry.name)
        else:
            app.command(entry.name)(found)
    return app


def invoked(arguments: list[str]) -> str | None:
    """The top-level command in `arguments`, when it is one (options before it: the whole app)."""
    if arguments and arguments[0] in NAMES:
        return arguments[0]
    return None


def __getattr__(name: str) -> Any:
    if name == "app":
        app = build()
        globals()["app"] = app
        return app
    raise AttributeError(f"module 'daedalus.cli' has no attribute {name!r}")


def main() -> None:
    from daedalus.logs import configure_logging

    configure_logging()
    from daedalus.errors import DaedalusError

    command = invoked(sys.argv[1:])
    try:
        build(command)()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except DaedalusError as error:  # raised on purpose, with a message that says what to do: no traceback
        from daedalus.cli._common import errors
        from daedalus.escaping import for_terminal

        errors.print(f"[red]error:[/red] {for_terminal(str(error))}", highlight=False)
        code = 2
    except Exception as error:  # a defect or a surprise: one log record with the traceback as data (logs.py)
        from daedalus.logs import log_unexpected

        log_unexpected(error, command)
        code = 1
    # Skip interpreter teardown: the Temporal client's Rust threads can abort a finalizing interpreter
    # ("PyGILState_Release ... finalizing", temporalio/sdk-python#300), turning a finished command into exit -6.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
