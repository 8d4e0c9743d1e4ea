"""The HTTP API: programmatic ticket creation, decisions, audit queries and Slack interactions."""

from daedalus.api.app import create_app

__all__ = ["create_app"]
