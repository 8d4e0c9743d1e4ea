"""The one service layer every entry point calls (CLI, HTTP API, Slack, the demo): tickets, training runs
and decisions. Each turns Temporal's errors into `TicketError`s whose messages say what to do."""

from daedalus.services._temporal import TicketError as TicketError
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
