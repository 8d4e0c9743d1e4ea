"""The CLI fixtures (a configured environment, running workers) for every CLI test module."""

from tests.cli.test_ticket_cli import cli_env, workers

__all__ = ["cli_env", "workers"]
