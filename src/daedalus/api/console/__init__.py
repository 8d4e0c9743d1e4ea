"""The decider's console: server-rendered pages under /console, signed in with an API token (routes.py)."""

from daedalus.api.console.routes import router

__all__ = ["router"]
