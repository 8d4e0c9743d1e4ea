"""What the CLI asks of a stack, typed: one `StackClient` protocol, chosen once per command by `stack_client()`.

`LocalStack` answers through the service layer, Temporal and the store (the embedded, single-user stack of
`daedalus up` and the demo, which trusts the local user's `--as`). `SharedStack` answers through a shared stack's
authenticated HTTP API (DAEDALUS_API_URL, DAEDALUS_API_TOKEN), acting as the token's person, and parses every
answer with the API's own response models (daedalus.api.models): a command reads fields, never raw JSON.

Both import what they use on first use: a command loads Temporal's client, the store or httpx only when its
stack needs them (tests/cli/test_startup.py holds every command to that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from daedalus.api.models import (
    AuditEventPublic,
    Delegated,
    QuestionAsked,
    QuestionPublic,
    RunStarted,
    TicketDetail,
    TicketFiled,
    TicketSummary,
)
from daedalus.cli._common import audit_key, client, fail, policy, run, settings, store, waiting_on_hosts
from daedalus.cli.remote import Remote, local_person, shared_stack
from daedalus.schemas.audit import AuditEvent
from daedalus.schemas.ticket import (
    CancelRequest,
    Decision,
    Delegation,
    SpecAmendment,
    TerminateRequest,
    TicketSpec,
    TicketState,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from daedalus.decisions.questions import QuestionSpec, QuestionStatus, WithdrawQuestion
    from daedalus.decisions.rulings import Ruling
    from daedalus.schemas.training import StopTraining, TrainingRunSpec, TrainingRunStatus

AS_HELP = "who acts; against a shared stack (DAEDALUS_API_URL) only your token's person, and the default"


@dataclass(frozen=True)
class Filed:
    """A filed ticket, and where to watch it (a local stack's Temporal UI; None against a shared stack)."""

    filed: TicketFiled
    ui_url: str | None = None
    """The workflow's page in the local Temporal UI; None when the filing was made through a shared API."""


@dataclass(frozen=True)
class TicketView:
    """What `ticket show` prints: the live state (None when Temporal did not answer in time), the store's row,
    the line saying the ticket waits on a host nobody serves, and each sub-ticket's status from its own trail."""

    live: TicketState | None
    projection: TicketSummary | None
    waiting_on_host: str | None = None
    children_recorded: dict[str, str] = field(default_factory=dict)


class StackClient(Protocol):
    """Everything the ticket, decision, audit, question and training commands ask of a stack."""

    shared: bool
    """Whether this is a shared stack's API, whose answers name the token's person."""

    def acting_as(self, claimed: str | None, flag: str = "--as") -> str:
        """Who acts: the local user's word (which must be said), or the shared stack's token's person."""
        ...

    def filer(self, claimed: str | None, flag: str = "--as") -> str:
        """Who files a ticket or starts or stops a run (a local stack without a policy records an unnamed one
        as `cli`)."""
        ...

    def file_ticket(self, spec: TicketSpec, filed_by: str) -> Filed: ...

    def list_tickets(self, status: str | None) -> list[TicketSummary]:
        """The store's projection, newest first, each ticket stuck on a host no worker polls saying so."""
        ...

    def show_ticket(self, ticket_id: str) -> TicketView: ...

    def amend(self, ticket_id: str, amendment: SpecAmendment) -> TicketState: ...

    def cancel(self, ticket_id: str, request: CancelRequest) -> TicketState: ...

    def terminate(self, ticket_id: str, request: TerminateRequest) -> list[AuditEvent]:
        """The closing audit events written for the ticket and its live sub-tickets."""
        ...

    def decide(self, decision: Decision) -> None: ...

    def delegate(self, ticket_id: str, delegation: Delegation) -> list[str]:
        """Everyone who may now decide that kind of decision for the ticket."""
        ...

    def audit(
        self, ticket: str | None, actor: str | None, since: datetime | None, limit: int
    ) -> list[AuditEventPublic]:
        """Audit events oldest first."""
        ...

    def ask_question(self, spec: QuestionSpec, asked_by: str) -> QuestionAsked: ...

    def list_questions(self, pending: bool) -> list[QuestionPublic]:
        """Questions from the store, oldest first."""
        ...

    def question(self, question_id: str) -> QuestionStatus: ...

    def withdraw_question(self, question_id: str, request: WithdrawQuestion) -> QuestionStatus: ...

    def rulings(self) -> list[Ruling]:
        """The standing rulings, oldest first."""
        ...

    def start_run(self, spec: TrainingRunSpec, started_by: str) -> RunStarted: ...

    def run_status(self, name: str) -> TrainingRunStatus: ...

    def stop_run(self, name: str, request: StopTraining) -> TrainingRunStatus: ...

    def decide_run(self, name: str, decision: Decision) -> TrainingRunStatus:
        """Answer the run's pending decision; the run's status as the answer left it."""
        ...


def stack_client() -> StackClient:
    """The shared stack's API when DAEDALUS_API_URL is set, else the local, embedded stack."""
    remote = shared_stack()
    return LocalStack() if remote is None else SharedStack(remote)


class LocalStack:
    """The embedded stack: the service layer against Temporal and the store, the local user's word for who acts."""

    shared = False

    def acting_as(self, claimed: str | None, flag: str = "--as") -> str:
        return local_person(claimed, flag)

    def filer(self, claimed: str | None, flag: str = "--as") -> str:
        # Without a policy the local stack records an unnamed filer as `cli`; under one, who files decides who
        # may approve, so it must be said.
        return local_person(claimed, flag) if policy() is not None else claimed or "cli"

    def file_ticket(self, spec: TicketSpec, filed_by: str) -> Filed:
        from daedalus import services
        from daedalus.cli._common import registry

        temporal = settings().temporal
        hosts = registry()

        async def go() -> TicketFiled:
            handle = await services.file_ticket(
                await client(),
                spec,
                queue=temporal.control_queue,
                filed_by=filed_by,
                hosts=hosts,
                policy=policy(),
                store=store(),
            )
            return TicketFiled(
                ticket_id=spec.id,
                workflow_id=handle.id,
                run_id=handle.first_execution_run_id,
                filed_by=filed_by,
            )

        filed = run(go())
        ui = f"http://localhost:{temporal.ui_port}/namespaces/{temporal.namespace}/workflows/{filed.workflow_id}"
        return Filed(filed, ui_url=ui)

    def list_tickets(self, status: str | None) -> list[TicketSummary]:
        from daedalus.store import queries
        from daedalus.store.database import session_scope

        with session_scope(store()) as session:
            rows = queries.list_tickets(session=session, status=status)
        waiting = waiting_on_hosts(rows)
        return [
            TicketSummary.model_validate(row).model_copy(
                update={"waiting_on_host": waiting.get(row.ticket_id)}
            )
            for row in rows
        ]

    def show_ticket(self, ticket_id: str) -> TicketView:
        from daedalus import services
        from daedalus.store import queries
        from daedalus.store.database import session_scope

        async def go() -> TicketState:
            return await services.status(await client(), ticket_id)

        state = run(go())
        with session_scope(store()) as session:
            row = queries.get_ticket(session=session, ticket_id=ticket_id)
            waiting = waiting_on_hosts([row]) if row is not None and row.status == state.status.value else {}
            recorded = {
                child: found.status
                for child in state.children
                if (found := queries.get_ticket(session=session, ticket_id=child)) is not None
            }
            projection = TicketSummary.model_validate(row) if row is not None else None
        return TicketView(state, projection, waiting.get(ticket_id), recorded)

    def amend(self, ticket_id: str, amendment: SpecAmendment) -> TicketState:
        from daedalus import services

        async def go() -> TicketState:
            return await services.amend(await client(), ticket_id, amendment)

        return run(go())

    def cancel(self, ticket_id: str, request: CancelRequest) -> TicketState:
        from daedalus import services

        async def go() -> TicketState:
            return await services.cancel(await client(), ticket_id, request)

        return run(go())

    def terminate(self, ticket_id: str, request: TerminateRequest) -> list[AuditEvent]:
        from daedalus.services import termination

        async def go() -> list[AuditEvent]:
            return await termination.terminate(
                await client(),
                ticket_id,
                by=request.requested_by,
                reason=request.reason,
                store=store(),
                key=audit_key(),
                policy=policy(),
            )

        return run(go())

    def decide(self, decision: Decision) -> None:
        from daedalus import services

        async def go() -> object:
            return await services.decide(await client(), decision, store=store(), policy=policy())

        run(go())

    def delegate(self, ticket_id: str, delegation: Delegation) -> list[str]:
        from daedalus import services

        found = policy()

        async def go() -> list[str]:
            return await services.delegate(await client(), ticket_id, delegation, policy=found)

        return run(go())

    def audit(
        self, ticket: str | None, actor: str | None, since: datetime | None, limit: int
    ) -> list[AuditEventPublic]:
        from daedalus.store import queries
        from daedalus.store.database import session_scope

        with session_scope(store()) as session:
            rows = queries.audit_events(
                session=session, ticket_id=ticket, actor=actor, since=since, limit=limit
            )
            return [AuditEventPublic.model_validate(row) for row in rows]

    def ask_question(self, spec: QuestionSpec, asked_by: str) -> QuestionAsked:
        from daedalus.services import questions

        temporal = settings().temporal

        async def go() -> str:
            handle = await questions.ask(
                await client(),
                spec,
                queue=temporal.control_queue,
                asked_by=asked_by,
                policy=policy(),
                store=store(),
            )
            return handle.id

        workflow_id = run(go())
        deciders = questions.resolve_deciders(spec, asked_by, policy())
        return QuestionAsked(
            question_id=spec.id, workflow_id=workflow_id, asked_by=asked_by, deciders=deciders
        )

    def list_questions(self, pending: bool) -> list[QuestionPublic]:
        from daedalus.services import questions
        from daedalus.store.database import session_scope

        with session_scope(store()) as session:
            return [QuestionPublic.from_row(row) for row in questions.question_rows(session, pending=pending)]

    def question(self, question_id: str) -> QuestionStatus:
        from daedalus.services import questions

        async def go() -> QuestionStatus:
            return await questions.status(await client(), question_id)

        return run(go())

    def withdraw_question(self, question_id: str, request: WithdrawQuestion) -> QuestionStatus:
        from daedalus.services import questions

        async def go() -> QuestionStatus:
            return await questions.withdraw(await client(), question_id, request)

        return run(go())

    def rulings(self) -> list[Ruling]:
        from daedalus.services import questions

        return questions.read_rulings(store())

    def start_run(self, spec: TrainingRunSpec, started_by: str) -> RunStarted:
        from daedalus import services
        from daedalus.cli._common import registry

        async def go() -> RunStarted:
            handle = await services.start_run(
                await client(),
                spec,
                queue=settings().temporal.control_queue,
                hosts=registry(),
                started_by=started_by,
                policy=policy(),
            )
            return RunStarted(
                name=spec.name,
                workflow_id=handle.id,
                run_id=handle.first_execution_run_id,
                host=spec.host,
                started_by=started_by,
            )

        return run(go())

    def run_status(self, name: str) -> TrainingRunStatus:
        from daedalus import services

        async def go() -> TrainingRunStatus:
            return await services.run_status(await client(), name)

        return run(go())

    def stop_run(self, name: str, request: StopTraining) -> TrainingRunStatus:
        from daedalus import services

        async def go() -> TrainingRunStatus:
            return await services.stop_run(await client(), name, request, policy=policy())

        return run(go())

    def decide_run(self, name: str, decision: Decision) -> TrainingRunStatus:
        from daedalus import services
        from daedalus.decisions.schemas import TrainingRunSubject
        from daedalus.schemas.training import TrainingRunStatus

        async def go() -> TrainingRunStatus:
            decided = await services.decide(
                await client(), decision, subject=TrainingRunSubject(run=name), policy=policy()
            )
            if not isinstance(decided, TrainingRunStatus):
                fail(
                    f"training run {name}: its decide update answered with {type(decided).__name__}, not its status"
                )
            return decided

        return run(go())


class SharedStack:
    """A shared stack's HTTP API, as the token's person; every answer parsed with the API's response model."""

    shared = True

    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    def acting_as(self, claimed: str | None, flag: str = "--as") -> str:
        return self.remote.acting_as(claimed)

    def filer(self, claimed: str | None, flag: str = "--as") -> str:
        return self.remote.acting_as(claimed)

    def _post(self, path: str, body: BaseModel) -> Any:
        return self.remote.call("POST", path, json=body.model_dump(mode="json"))

    def file_ticket(self, spec: TicketSpec, filed_by: str) -> Filed:
        return Filed(TicketFiled.model_validate(self._post("/tickets", spec)))

    def list_tickets(self, status: str | None) -> list[TicketSummary]:
        found = self.remote.call("GET", "/tickets", params={"status": status} if status else {})
        return [TicketSummary.model_validate(row) for row in found]

    def _detail(self, ticket_id: str) -> TicketDetail:
        return TicketDetail.model_validate(self.remote.call("GET", f"/tickets/{ticket_id}"))

    def show_ticket(self, ticket_id: str) -> TicketView:
        detail = self._detail(ticket_id)
        row = detail.projection
        if detail.live is None:
            return TicketView(None, row, row.waiting_on_host if row is not None else None)
        # The API's waiting line is the store row's; it holds while the live state has not moved past the row.
        waiting = row.waiting_on_host if row is not None and row.status == detail.live.status.value else None
        recorded = {}
        for child, status in detail.live.children.items():
            if not status.is_closed:  # the parent records a child's status only when it starts and closes
                child_row = self._detail(child).projection
                if child_row is not None:
                    recorded[child] = child_row.status
        return TicketView(detail.live, row, waiting, recorded)

    def amend(self, ticket_id: str, amendment: SpecAmendment) -> TicketState:
        return TicketState.model_validate(self._post(f"/tickets/{ticket_id}/amendments", amendment))

    def cancel(self, ticket_id: str, request: CancelRequest) -> TicketState:
        return TicketState.model_validate(self._post(f"/tickets/{ticket_id}/cancel", request))

    def terminate(self, ticket_id: str, request: TerminateRequest) -> list[AuditEvent]:
        events = self._post(f"/tickets/{ticket_id}/terminate", request)
        return [AuditEvent.model_validate(event) for event in events]

    def decide(self, decision: Decision) -> None:
        self._post("/decisions", decision)

    def delegate(self, ticket_id: str, delegation: Delegation) -> list[str]:
        return Delegated.model_validate(self._post(f"/tickets/{ticket_id}/delegations", delegation)).delegates

    def audit(
        self, ticket: str | None, actor: str | None, since: datetime | None, limit: int
    ) -> list[AuditEventPublic]:
        query: dict[str, str | int] = {"limit": limit}
        query.update({k: v for k, v in (("ticket", ticket), ("actor", actor)) if v is not None})
        if since is not None:
            query["since"] = since.isoformat()
        return [
            AuditEventPublic.model_validate(event)
            for event in self.remote.call("GET", "/audit", params=query)
        ]

    def ask_question(self, spec: QuestionSpec, asked_by: str) -> QuestionAsked:
        return QuestionAsked.model_validate(self._post("/questions", spec))

    def list_questions(self, pending: bool) -> list[QuestionPublic]:
        found = self.remote.call("GET", "/questions", params={"pending": pending})
        return [QuestionPublic.model_validate(row) for row in found]

    def question(self, question_id: str) -> QuestionStatus:
        from daedalus.decisions.questions import QuestionStatus

        return QuestionStatus.model_validate(self.remote.call("GET", f"/questions/{question_id}"))

    def withdraw_question(self, question_id: str, request: WithdrawQuestion) -> QuestionStatus:
        from daedalus.decisions.questions import QuestionStatus

        return QuestionStatus.model_validate(self._post(f"/questions/{question_id}/withdraw", request))

    def rulings(self) -> list[Ruling]:
        from daedalus.decisions.rulings import Ruling

        return [Ruling.model_validate(ruling) for ruling in self.remote.call("GET", "/rulings")]

    def start_run(self, spec: TrainingRunSpec, started_by: str) -> RunStarted:
        return RunStarted.model_validate(self._post("/training", spec))

    def run_status(self, name: str) -> TrainingRunStatus:
        from daedalus.schemas.training import TrainingRunStatus

        return TrainingRunStatus.model_validate(self.remote.call("GET", f"/training/{name}"))

    def stop_run(self, name: str, request: StopTraining) -> TrainingRunStatus:
        from daedalus.schemas.training import TrainingRunStatus

        return TrainingRunStatus.model_validate(self._post(f"/training/{name}/stop", request))

    def decide_run(self, name: str, decision: Decision) -> TrainingRunStatus:
        from daedalus.schemas.training import TrainingRunStatus

        return TrainingRunStatus.model_validate(self._post("/decisions", decision))
