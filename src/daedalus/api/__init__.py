"""The HTTP API: programmatic ticket creation, decisions, audit queries, Slack interactions and the console.

`create_app` is imported on first use, so that `daedalus.api.settings` (which the CLI's settings read) does not
load FastAPI, the report and its plotting libraries into every CLI command."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daedalus.api.app import create_app as create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from daedalus.api.app import create_app

        return create_app
    raise AttributeError(f"module 'daedalus.api' has no attribute {name!r}")
