"""Tickets: read and check a spec, file it, delegate, amend, cancel, read its status.

CLI, HTTP API and the demo call these; each turns Temporal's errors into `TicketError`s whose messages say
what is wrong and how to fix it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError
from sqlalchemy import Engine
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowQueryFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from daedalus.errors import NotAllowed
from daedalus.hosts.registry import Registry
from daedalus.ids import ticket_workflow_id
from daedalus.schemas import search_attributes
from daedalus.schemas.limits import RESERVED_TICKET_PREFIXES, SPEC_BYTES
from daedalus.schemas.ticket import (
    CancelRequest,
    Delegation,
    SpecAmendment,
    TicketInput,
    TicketSpec,
    TicketState,
)
from daedalus.schemas.ui import start_details, start_summary
from daedalus.services._temporal import TicketError, update
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.ticket import TicketWorkflow

# Imported where used: `daedalus ticket show` reads a status and pays for neither the policy nor the prompt-fit
# check.
if TYPE_CHECKING:
    from daedalus.decisions.policy import Policy


def explain(error: ValidationError, source: str) -> str:
    """A pydantic error as lines a person can act on: where, what is wrong, what was given."""
    lines = [f"{source} is not a valid ticket spec ({error.error_count()} problem(s)):"]
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        given = problem.get("input")
        shown = "" if isinstance(given, dict | list) else f" (got {given!r})"
        lines.append(f"  - {where}: {problem['msg']}{shown}")
    return "\n".join(lines)


def parse_spec(data: Any, source: str = "spec") -> TicketSpec:
    if not isinstance(data, dict):
        raise TicketError(
            f"{source} must be a mapping of ticket fields (id, title, host, ...), not {type(data).__name__}"
        )
    try:
        spec = TicketSpec.model_validate(data)
    except ValidationError as error:
        raise TicketError(explain(error, source)) from error
    require_workable(spec, source)
    return spec


def require_workable(spec: TicketSpec, source: str = "spec") -> None:
    """Rules checked when a ticket is filed (not in the schema, so that stored histories still load)."""
    from daedalus.engines.gate_fit import prompt_fit_problems

    tickets = spec.tree()
    ids = [t.id for t in tickets]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise TicketError(
            f"{source}: ticket ids must be unique across the ticket and all its sub-tickets; repeated: {repeated}"
        )
    for ticket in tickets:
        reserved = next((p for p in RESERVED_TICKET_PREFIXES if ticket.id.startswith(p)), None)
        if reserved is not None:
            raise TicketError(
                f"{source}: ticket id {ticket.id!r} starts with {reserved!r}, which Daedalus reserves for the "
                f"subjects of training runs and campaigns and the hunting tickets runs open; choose another id"
            )
    for ticket in tickets:
        if ticket.agent is not None and ticket.engine is None:
            raise TicketError(
                f"{source}: ticket {ticket.id} names agent {ticket.agent.name.value} but no engine: the agent "
                f"needs a repository to work in; add `engine: {{name: ..., kind: repo, repo: <path or URL>, "
                f"base_commit: ...}}`"
            )
    unfit = [problem for ticket in tickets for problem in prompt_fit_problems(ticket)]
    if unfit:
        raise TicketError(f"{source}: " + "; ".join(unfit))


def load_spec(path: Path) -> TicketSpec:
    """Read a YAML or JSON ticket spec; every problem is reported with its field path."""
    try:
        with path.open("rb") as file:
            raw = file.read(SPEC_FILE_BYTES + 1)
    except OSError as error:
        raise TicketError(f"cannot read {path}: {error.strerror}") from error
    if len(raw) > SPEC_FILE_BYTES:
        raise TicketError(
            f"{path} is larger than {SPEC_FILE_BYTES // 1024} KiB; a ticket spec is at most "
            f"{SPEC_BYTES // 1024} KiB: put long briefs, patches and data in the repository and reference them"
        )
    try:
        data = yaml.load(raw.decode(errors="replace"), Loader=_SpecLoader)
    except yaml.YAMLError as error:
        raise TicketError(f"{path} is not valid YAML: {error}") from error
    return parse_spec(data, str(path))


SPEC_FILE_BYTES = 2 * SPEC_BYTES
"""A spec file may hold comments and indentation besides the spec itself."""


class _SpecLoader(yaml.SafeLoader):
    """YAML without aliases: ten nested aliases expand a few hundred bytes into a billion list items."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(
                f"aliases (*{getattr(event, 'anchor', '')}) are not allowed in a ticket spec "
                f"(line {event.start_mark.line + 1}); write the value out"
            )
        return super().compose_node(parent, index)


def require_known_hosts(spec: TicketSpec, hosts: Registry) -> None:
    """Every host the ticket (and its children) names is declared in the host registry."""
    for ticket in spec.tree():
        if ticket.host not in hosts.names:
            raise TicketError(
                f"ticket {ticket.id} names unknown host {ticket.host!r}; hosts.yaml declares: "
                f"{', '.join(hosts.names)} (fix the ticket's `host:`, or add the host to hosts.yaml)"
            )


async def file_ticket(
    client: Client,
    spec: TicketSpec,
    *,
    queue: str,
    filed_by: str = "cli",
    hosts: Registry | None = None,
    policy: Policy | None = None,
    store: Engine | None = None,
) -> WorkflowHandle[Any, Any]:
    """Start `ticket-<id>`; refuses while a ticket with that id is live, allows re-filing a closed one.

    With the audit `store`, a re-filed ticket numbers its decision requests on from its earlier filings'
    (`4-dispatch-2` after `4-dispatch-1`), so no request id is ever asked twice.

    With `hosts` (the registry), a ticket naming an undeclared host is refused before anything starts, and the
    workflow is told each host's schedule-to-start limit and GPUs (without it: no limit, no GPU leases). With
    the server's `policy` (every entry point that has one passes it), the filer must be allowed to file, a
    spec that loosens its approval is refused, and the ticket waits for a dispatch decision by someone else
    unless the policy lets the filer operate its hosts. Without one, the spec's own approval rules apply.
    """
    require_workable(spec)
    await _refuse_live_children(client, spec)
    facts = {}
    if hosts is not None:
        require_known_hosts(spec, hosts)
        facts = {t.host: hosts.host(t.host).facts() for t in spec.tree()}
    dispatch = None
    if policy is not None:
        from daedalus.decisions.policy import resolve_ticket

        spec, dispatch = resolve_ticket(policy, spec, filed_by)
    if store is not None:  # a ticket that contradicts a standing ruling is refused, naming the ruling
        from daedalus.services.questions import read_rulings, require_obeys_rulings

        require_obeys_rulings(spec, await asyncio.to_thread(read_rulings, store))
    try:
        asked = await asyncio.to_thread(_requests_asked, store, spec) if store is not None else {}
        return await client.start_workflow(
            TicketWorkflow.run,
            TicketInput(spec=spec, filed_by=filed_by, dispatch=dispatch, hosts=facts, requests_before=asked),
            id=ticket_workflow_id(spec.id),
            task_queue=queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            search_attributes=search_attributes.at_start(spec),
            static_summary=start_summary(spec),
            static_details=start_details(spec),
        )
    except WorkflowAlreadyStartedError as error:
        raise TicketError(
            f"ticket {spec.id} is already live (workflow {ticket_workflow_id(spec.id)}); amend it, cancel it, "
            f"or file under another id"
        ) from error
    except RPCError as error:
        raise TicketError(f"Temporal refused ticket {spec.id}: {error.message}") from error


async def _refuse_live_children(client: Client, spec: TicketSpec) -> None:
    """A sub-ticket whose id is live would make its parent fail when it gets to it, possibly days later."""
    for child in spec.tree()[1:]:
        try:
            description = await client.get_workflow_handle(ticket_workflow_id(child.id)).describe()
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                continue
            raise TicketError(
                f"cannot check whether sub-ticket {child.id} is live: {error.message}"
            ) from error
        if description.status is WorkflowExecutionStatus.RUNNING:
            raise TicketError(
                f"sub-ticket {child.id} of {spec.id} is already live (workflow {ticket_workflow_id(child.id)}); "
                f"give the sub-ticket another id, or cancel the live one first"
            )


def _requests_asked(store: Engine, spec: TicketSpec) -> dict[str, int]:
    with session_scope(store) as session:
        return queries.requests_asked(session=session, subjects=[ticket.id for ticket in spec.tree()])


def _label(ticket_id: str) -> str:
    return f"ticket {ticket_id}"


async def delegate(
    client: Client, ticket_id: str, delegation: Delegation, *, policy: Policy | None = None
) -> list[str]:
    """Let someone decide one kind of decision for a ticket. With the server's `policy`, a delegation it would
    never honour (a run-time dispatch delegate, a person it does not know) is refused before it is sent, so no
    audit event records a delegation that does not work; the ticket's validator checks the rest."""
    if policy is not None:
        why = policy.delegation_refusal(delegation)
        if why is not None:
            raise NotAllowed(f"ticket {ticket_id}: {why}")
    result: list[str] = await update(
        client, ticket_workflow_id(ticket_id), _label(ticket_id), TicketWorkflow.delegate, delegation
    )
    return result


async def amend(client: Client, ticket_id: str, amendment: SpecAmendment) -> TicketState:
    result: TicketState = await update(
        client, ticket_workflow_id(ticket_id), _label(ticket_id), TicketWorkflow.amend, amendment
    )
    return result


async def cancel(client: Client, ticket_id: str, request: CancelRequest) -> TicketState:
    result: TicketState = await update(
        client, ticket_workflow_id(ticket_id), _label(ticket_id), TicketWorkflow.cancel, request
    )
    return result


async def status(client: Client, ticket_id: str) -> TicketState:
    handle = client.get_workflow_handle(ticket_workflow_id(ticket_id))
    try:
        result: TicketState = await handle.query(TicketWorkflow.state)
        return result
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise TicketError(f"no ticket {ticket_id} in Temporal ({error.message})") from error
        raise TicketError(
            f"ticket {ticket_id} exists but did not answer ({error.message}); is a control-queue worker running?"
        ) from error
    except WorkflowQueryFailedError as error:
        raise TicketError(f"ticket {ticket_id} could not report its status: {error}") from error
