"""structlog, configured once at an entry point: a console renderer on a TTY, JSON lines otherwise.

One format for everything a process logs: Daedalus's own structlog loggers, the standard library's loggers
(Temporal's Python worker, uvicorn, alembic, httpx) and Temporal's core, the Rust half of the SDK, whose WARN
lines (a poll retried while the server is away) are forwarded to the logger `temporalio.core` instead of being
written to stdout in its own colours (`route_temporal_core`, called where a process first connects to Temporal).

An exception is a structured field: in JSON, `exception` is a list (the exception and each cause) of
`{"exc_type", "exc_value", "frames": [{"filename", "lineno", "name"}, ...]}`, never a traceback's text spread
over lines between the records; on a TTY the console renderer prints it as a readable traceback.

httpx and httpcore announce every request at INFO ("HTTP Request: GET ..."), alembic its dialect on every
start: they speak at WARNING only."""

import logging
import sys

import structlog

QUIET = {"alembic": logging.WARNING, "httpx": logging.WARNING, "httpcore": logging.WARNING}
"""Alembic announces its dialect on every start; httpx every request; Temporal's worker logs its own failures."""

TEMPORAL_CORE_LOGGER = "temporalio.core"
"""Where Temporal's core (Rust) log lines arrive, each named after its target (`temporalio.core.<target>`)."""
_routed: list[str] = []


def _temporal_core_fields(
    _: object, __: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """A record forwarded from Temporal's core carries its target and fields as fields, not inside the text."""
    record = event_dict.get("_record")
    core = getattr(record, "temporal_log", None)
    if core is not None:
        event_dict["target"] = core.target
        try:
            fields = core.fields
        except Exception:  # core's fields failed to convert: the message alone still says what happened
            fields = {}
        for key, value in fields.items():
            event_dict.setdefault(key, value if isinstance(value, str | int | float | bool) else str(value))
    return event_dict


def _renderer(tty: bool) -> list[structlog.typing.Processor]:
    """The last processors of every record: exceptions as data in JSON (the console renderer draws its own)."""
    if tty:
        return [structlog.dev.ConsoleRenderer()]
    return [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]


def configure_logging(level: str = "INFO", *, tty: bool | None = None) -> None:
    """Route every logger of this process through one handler and renderer on stderr (`tty`: whether stderr is
    a TTY). structlog's loggers are the standard library's too: one handler writes each record whole, so a
    record of Temporal's core, forwarded from another thread, never lands inside one of ours."""
    tty = sys.stderr.isatty() if tty is None else tty
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
        structlog.stdlib.add_logger_name,
    ]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_renderer(tty)],
            foreign_pre_chain=[*shared, _temporal_core_fields],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    for name, quiet in QUIET.items():
        logging.getLogger(name).setLevel(quiet)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )


def route_temporal_core(level: str = "WARN") -> None:
    """Forward Temporal core's log lines at `level` and above to the logger `temporalio.core` (so to the
    renderer above) instead of core's own writer on stdout. Call it before this process's first connection:
    the default runtime, which every client and worker uses, is the one made here. Imported only then, so a
    command that never talks to Temporal does not load the SDK's runtime. A second call changes nothing."""
    if _routed:
        return
    from temporalio.runtime import (
        LogForwardingConfig,
        LoggingConfig,
        Runtime,
        TelemetryConfig,
        TelemetryFilter,
    )

    forwarding = (
        LogForwardingConfig(  # the target and fields become fields of the record (_temporal_core_fields)
            logger=logging.getLogger(TEMPORAL_CORE_LOGGER),
            append_target_to_name=False,
            prepend_target_on_message=False,
            append_log_fields_to_message=False,
        )
    )
    telemetry = TelemetryConfig(
        logging=LoggingConfig(
            filter=TelemetryFilter(core_level=level, other_level="ERROR"), forwarding=forwarding
        )
    )
    Runtime.set_default(Runtime(telemetry=telemetry), error_if_already_set=False)
    _routed.append(level)


def log_unexpected(error: BaseException, command: str | None) -> None:
    """A command's unexpected failure as one record (the traceback a field of it), not a traceback on stderr."""
    structlog.get_logger("daedalus.cli").error(
        "command failed", command=command, error=f"{type(error).__name__}: {error}", exc_info=error
    )
