"""The one service layer every entry point calls (CLI, HTTP API, Slack, the demo): tickets, training runs
and decisions. Each turns Temporal's errors into refusals (`RequestRefused`, one kind per subject) whose messages say
what to do.

Each name is imported from its module on first use: `daedalus ticket show` needs `status`, not the decision
desk, the training runs and every workflow they name (a CLI command pays each import on every start)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daedalus.services._temporal import CampaignRefused as CampaignRefused
    from daedalus.services._temporal import RequestRefused as RequestRefused
    from daedalus.services._temporal import TicketError as TicketError
    from daedalus.services._temporal import TrainingRefused as TrainingRefused
    from daedalus.services._temporal import UnknownRequest as UnknownRequest
    from daedalus.services._temporal import connect as connect
    from daedalus.services.decisions import decide as decide
    from daedalus.services.tickets import amend as amend
    from daedalus.services.tickets import cancel as cancel
    from daedalus.services.tickets import delegate as delegate
    from daedalus.services.tickets import explain as explain
    from daedalus.services.tickets import file_ticket as file_ticket
    from daedalus.services.tickets import load_spec as load_spec
    from daedalus.services.tickets import parse_spec as parse_spec
    from daedalus.services.tickets import require_known_hosts as require_known_hosts
    from daedalus.services.tickets import require_workable as require_workable
    from daedalus.services.tickets import status as status
    from daedalus.services.training import load_run_spec as load_run_spec
    from daedalus.services.training import parse_run_spec as parse_run_spec
    from daedalus.services.training import run_status as run_status
    from daedalus.services.training import start_run as start_run
    from daedalus.services.training import stop_run as stop_run

_EXPORTS = {
    "CampaignRefused": "_temporal",
    "RequestRefused": "_temporal",
    "TicketError": "_temporal",
    "TrainingRefused": "_temporal",
    "UnknownRequest": "_temporal",
    "connect": "_temporal",
    "decide": "decisions",
    **dict.fromkeys(
        (
            "amend",
            "cancel",
            "delegate",
            "explain",
            "file_ticket",
            "load_spec",
            "parse_spec",
            "require_known_hosts",
            "require_workable",
            "status",
        ),
        "tickets",
    ),
    **dict.fromkeys(("load_run_spec", "parse_run_spec", "run_status", "start_run", "stop_run"), "training"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'daedalus.services' has no attribute {name!r}")
    found = getattr(importlib.import_module(f"daedalus.services.{module}"), name)
    globals()[name] = found
    return found
