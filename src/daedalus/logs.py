"""structlog, configured once at an entry point: a console renderer on a TTY, JSON lines otherwise."""

import logging
import sys

import structlog


def configure_logging(level: str = "INFO") -> None:
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    )
    logging.basicConfig(level=level, stream=sys.stderr, format="%(message)s")
    # Alembic announces its dialect on every start; Temporal's worker logs its own failures with context.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
