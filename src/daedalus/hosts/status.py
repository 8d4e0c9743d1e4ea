"""What `daedalus hosts` shows: who polls each host's queue (Temporal's task-queue description), its backlog,
and the lease keeper's state; and the line that says why a step is stuck on a host nobody serves."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from pydantic import Field
from temporalio.api.enums.v1 import DescribeTaskQueueMode, TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.service import RPCError

from daedalus.hosts.leases import KeeperState
from daedalus.hosts.registry import HostSpec, Registry
from daedalus.schemas._base import Model
from daedalus.schemas.ticket import TicketStatus

if TYPE_CHECKING:  # `ticket list` reads ON_A_HOST here and, with no ticket on a host, asks Temporal nothing
    from temporalio.client import Client

ON_A_HOST = frozenset({TicketStatus.DISPATCHED, TicketStatus.BUILDING, TicketStatus.GATING})
"""Statuses in which a ticket's current step is queued or running on its host."""

SEEN_WITHIN_S = 120.0
"""A poller last seen longer ago than this no longer counts as a worker serving the queue."""


class Poller(Model):
    identity: str
    last_seen: datetime | None


class QueueView(Model):
    """Temporal's view of a host's activity queue."""

    queue: str
    pollers: list[Poller] = Field(default_factory=list)
    backlog: int | None = None
    backlog_age_s: float | None = None
    error: str = ""

    def live_pollers(self, now: datetime) -> list[Poller]:
        return [
            p
            for p in self.pollers
            if p.last_seen is None or (now - p.last_seen).total_seconds() <= SEEN_WITHIN_S
        ]


class HostView(Model):
    host: HostSpec
    queue: QueueView
    keeper: KeeperState | None = None
    keeper_error: str = ""


async def describe_queue(client: Client, queue: str, namespace: str = "default") -> QueueView:
    """Pollers and backlog of an activity task queue, from DescribeTaskQueue (enhanced mode where supported)."""
    service = client.workflow_service
    base = DescribeTaskQueueRequest(
        namespace=namespace,
        task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    try:
        response = await service.describe_task_queue(base)
    except RPCError as error:
        return QueueView(queue=queue, error=f"cannot describe {queue}: {error.message}")
    pollers = [
        Poller(
            identity=p.identity,
            last_seen=p.last_access_time.ToDatetime(tzinfo=UTC) if p.HasField("last_access_time") else None,
        )
        for p in response.pollers
    ]
    backlog: int | None = None
    age: float | None = None
    # Backlog counts need the enhanced API (stats); older servers answer without them.
    enhanced = DescribeTaskQueueRequest()
    enhanced.CopyFrom(base)
    enhanced.api_mode = DescribeTaskQueueMode.DESCRIBE_TASK_QUEUE_MODE_ENHANCED
    enhanced.report_stats = True
    enhanced.task_queue_types.append(TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
    with contextlib.suppress(RPCError):
        stats = await service.describe_task_queue(enhanced)
        for version in stats.versions_info.values():
            for info in version.types_info.values():
                if info.HasField("stats"):
                    backlog = (backlog or 0) + info.stats.approximate_backlog_count
                    if info.stats.HasField("approximate_backlog_age"):
                        age = max(
                            age or 0.0, info.stats.approximate_backlog_age.ToTimedelta().total_seconds()
                        )
    return QueueView(queue=queue, pollers=pollers, backlog=backlog, backlog_age_s=age)


async def describe_hosts(client: Client, registry: Registry, namespace: str = "default") -> list[HostView]:
    from daedalus.hosts.holder import keeper_state  # the holder pulls in the workflow: only when asked

    views = []
    for host in registry.hosts:
        queue = await describe_queue(client, host.task_queue, namespace)
        keeper, problem = None, ""
        try:
            keeper = await keeper_state(client, host.name)
        except RPCError as error:
            problem = f"no lease keeper ({error.message}); the control worker starts it"
        views.append(HostView(host=host, queue=queue, keeper=keeper, keeper_error=problem))
    return views


def queued_explanation(
    host: str, queue: str, since: datetime, pollers: list[Poller], now: datetime
) -> str | None:
    """The line a step stuck on an unserved host shows in `ticket show`, `ticket list`, the API and the report:
    "queued for host-mavis since 22:03; no worker polls it; run `daedalus worker --host mavis` there".
    None while a worker polls the queue (the step is merely waiting its turn)."""
    live = [p for p in pollers if p.last_seen is None or (now - p.last_seen).total_seconds() <= SEEN_WITHIN_S]
    if live:
        return None
    at = since.astimezone(UTC).strftime("%H:%M")
    if pollers:
        last = max(p.last_seen for p in pollers if p.last_seen is not None)
        seen = f"its last worker was seen at {last.astimezone(UTC).strftime('%H:%M')} UTC"
    else:
        seen = "no worker polls it"
    return f"queued for {queue} since {at} UTC; {seen}; run `daedalus worker --host {host}` there"


async def unserved(client: Client, host: HostSpec, since: datetime, namespace: str = "default") -> str | None:
    """For a step queued on `host` since `since`: the `queued_explanation` line when no worker polls its queue,
    else None. Cheap (one DescribeTaskQueue): `ticket show`, `ticket list`, the API and the report call it
    for each ticket whose current step is on a host."""
    queue = await describe_queue(client, host.task_queue, namespace)
    return queued_explanation(host.name, host.task_queue, since, queue.pollers, datetime.now(UTC))


class TicketOnHost(Protocol):
    """What `waiting_on_hosts` reads of a ticket: a store row or the API's summary of one."""

    @property
    def ticket_id(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def updated_at(self) -> datetime: ...


async def waiting_on_hosts(
    client: Client, registry: Registry, tickets: Iterable[TicketOnHost], namespace: str = "default"
) -> dict[str, str]:
    """ticket id -> the `queued_explanation` line, for each ticket whose current step is on a host no worker
    polls (since the ticket's last change: the step was scheduled then). One DescribeTaskQueue per host."""
    on_host = [t for t in tickets if t.status in ON_A_HOST and t.host in registry.names]
    queues: dict[str, QueueView] = {}
    now = datetime.now(UTC)
    lines: dict[str, str] = {}
    for ticket in on_host:
        host = registry.host(ticket.host)
        if host.name not in queues:
            queues[host.name] = await describe_queue(client, host.task_queue, namespace)
        queue = queues[host.name]
        if queue.error:
            continue  # Temporal could not say: no claim either way
        since = ticket.updated_at if ticket.updated_at.tzinfo else ticket.updated_at.replace(tzinfo=UTC)
        line = queued_explanation(host.name, host.task_queue, since, queue.pollers, now)
        if line is not None:
            lines[ticket.ticket_id] = line
    return lines
