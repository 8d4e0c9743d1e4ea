"""structlog, configured once at an entry point: a console renderer on a TTY, JSON lines otherwise.

Records of the standard library's loggers (Temporal's worker, uvicorn, alembic, httpx) go through the same
renderer, so a log has one format. httpx and httpcore announce every request at INFO ("HTTP Request: GET ...");
they speak at WARNING only."""

import logging
import sys

import structlog

QUIET = {"alembic": logging.WARNING, "httpx": logging.WARNING, "httpcore": logging.WARNING}
"""Alembic announces its dialect on every start; httpx every request; Temporal's worker logs its own failures."""


def configure_logging(level: str = "INFO") -> None:
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    for name, quiet in QUIET.items():
        logging.getLogger(name).setLevel(quiet)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
