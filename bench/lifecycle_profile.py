"""Where a ticket's lifecycle time goes, beside a bare workflow with the same activities (bench/lifecycle.py's).

On a dev server of its own, with the lifecycle bench's fakes (instant host activities under the real names):
(1) one ticket (no approval) and one bare workflow of its shape, each alone: from their histories, the workflow
    tasks (count, and per task: scheduled -> started, started -> completed), the remote activities (per type:
    count, scheduled -> completed) and the local activities (per type: count), start -> close;
(2) one ticket parked for dispatch approval, then decided through `daedalus.services.decide`: the decide's
    phases (client send -> the update's workflow task scheduled -> started -> completed -> the client has it), and
    what that workflow task carried (local activities before it completed);
(3) --tickets tickets and as many bare workflows at once (two batches), with cProfile on the worker's workflow
    thread (temporalio runs workflow activations in `workflow_task_executor`, given here a one-thread pool
    whose thread profiles itself): CPU seconds of workflow code per ticket and per bare workflow, and the
    functions where the ticket's went (by own time and by cumulative time).

Run: .venv/bin/python bench/lifecycle_profile.py [--tickets 40] [--results PATH]
Writes JSON (bench/results/lifecycle-profile.json) with the commit, the machine and the load (record.py).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.worker import Worker

import lifecycle as lc  # bench/ is on sys.path when the script runs
from bare_workflow import BareWorkflow
from daedalus import services as daedalus
from daedalus.decisions.schemas import TicketSubject
from daedalus.devserver import DevServer
from daedalus.ports import free_port
from daedalus.schemas.ticket import Decision, TicketStatus
from daedalus.worker import workflow_runner
from daedalus.workflows.ticket import TicketWorkflow
from record import RESULTS, Recording


class ProfiledThread:
    """A one-thread executor whose thread runs under cProfile (the workflow activations' thread)."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile(time.thread_time)  # the thread's CPU, not wall time
        self.executor = ThreadPoolExecutor(max_workers=1)

    def run_profiled(self, fn: Callable[[], None]) -> None:
        self.executor.submit(fn).result()

    def stats(self) -> pstats.Stats:
        return pstats.Stats(self.profile, stream=io.StringIO())


seconds = lc.seconds  # an event's time, in seconds


def history_profile(events: list[HistoryEvent]) -> dict[str, Any]:
    by_id = {e.event_id: e for e in events}
    queued, ran = [], []
    remote: dict[str, list[float]] = {}
    local: Counter[str] = Counter()
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            done = e.workflow_task_completed_event_attributes
            started, scheduled = by_id[done.started_event_id], by_id[done.scheduled_event_id]
            queued.append(seconds(started) - seconds(scheduled))
            ran.append(seconds(e) - seconds(started))
        elif e.HasField("activity_task_completed_event_attributes"):
            done_a = e.activity_task_completed_event_attributes
            sched = by_id[done_a.scheduled_event_id]
            name = sched.activity_task_scheduled_event_attributes.activity_type.name
            remote.setdefault(name, []).append(seconds(e) - seconds(sched))
        elif lc.is_local_activity(e):
            details = e.marker_recorded_event_attributes.details
            [data] = details["data"].payloads
            local[lc.json.loads(data.data)["activity_type"]] += 1
    return {
        "events": len(events),
        "event_types": dict(
            Counter(EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in events)
        ),
        "workflow_tasks": len(ran),
        "workflow_task_queued_ms": [round(x * 1000, 2) for x in queued],
        "workflow_task_ran_ms": [round(x * 1000, 2) for x in ran],
        "workflow_task_ran_total_ms": round(sum(ran) * 1000, 2),
        "remote_activities": {
            k: {"count": len(v), "total_ms": round(sum(v) * 1000, 2)} for k, v in remote.items()
        },
        "local_activities": dict(local),
        "start_to_close_ms": round((seconds(events[-1]) - seconds(events[0])) * 1000, 2),
    }


async def history(client: Client, workflow_id: str) -> list[HistoryEvent]:
    return [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]


def decide_profile(events: list[HistoryEvent], sent: float, answered: float) -> dict[str, Any]:
    accepted, scheduled, started, completed = lc.update_task(events)
    last_task = max(
        i for i in range(accepted) if events[i].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    carried = [e for e in events[last_task:accepted] if lc.is_local_activity(e)]
    return {
        "to_scheduled_ms": round((scheduled - sent) * 1000, 2),
        "queued_ms": round((started - scheduled) * 1000, 2),
        "worker_ms": round((completed - started) * 1000, 2),
        "to_client_ms": round((answered - completed) * 1000, 2),
        "total_ms": round((answered - sent) * 1000, 2),
        "local_activities_in_the_update_task": [
            lc.json.loads(e.marker_recorded_event_attributes.details["data"].payloads[0].data)[
                "activity_type"
            ]
            for e in carried
        ],
        "audit_events_in_the_update_task": sum(lc.local_audit_events(e) for e in carried),
    }


def top(stats: pstats.Stats, key: str, n: int) -> list[dict[str, Any]]:
    rows = []
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (file, line, fn), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        rows.append(
            {
                "function": f"{Path(file).name}:{line}({fn})",
                "path": file if "daedalus" in file else Path(file).name,
                "calls": calls,
                "own_s": round(tottime, 4),
                "cumulative_s": round(cumtime, 4),
            }
        )
    rows.sort(key=lambda r: -r[key])
    return rows[:n]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="daedalus-profile-") as tmp_dir:
        tmp = Path(tmp_dir)
        server = DevServer(
            db_file=tmp / "temporal.db",
            port=free_port(),
            ui_port=None,
            log_file=tmp / "server.log",
            die_with_parent=True,
        )
        with server:
            client = await daedalus.connect(server.address)
            thread = ProfiledThread()
            control = Worker(
                client,
                task_queue=lc.CONTROL,
                workflows=[TicketWorkflow, BareWorkflow],
                activities=[
                    lc.fake_audit,
                    lc.fake_audit_batch,
                    lc.fake_notify,
                    lc.fake_lessons_for,
                    lc.fake_record_lessons,
                    lc.noop,
                ],
                max_concurrent_activities=50,
                workflow_runner=workflow_runner(True, client.data_converter),
                workflow_task_executor=thread.executor,
            )
            async with control, lc.host_worker(client):
                shape = await lc.ticket_shape(client)  # warms the worker too
                await lc.bare_batch(client, 3, shape)
                await lc.ticket_batch(client, 3)
                # (1) one of each, alone
                handle = await daedalus.file_ticket(client, lc.spec(approval=False), queue=lc.CONTROL)
                assert (await handle.result()).status is TicketStatus.PASSED
                out["ticket"] = history_profile(await history(client, handle.id))
                bare_id = f"bare-{uuid.uuid4()}"
                bare = await client.start_workflow(BareWorkflow.run, shape, id=bare_id, task_queue=lc.CONTROL)
                await bare.result()
                out["bare"] = history_profile(await history(client, bare_id))
                out["shape"] = shape
                # (2) one decide, the ticket parked alone
                decides = []
                for _ in range(args.decides):
                    s = lc.spec(approval=True)
                    parked = await daedalus.file_ticket(client, s, queue=lc.CONTROL)
                    while (
                        await parked.query(TicketWorkflow.state)
                    ).status is not TicketStatus.AWAITING_APPROVAL:
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.2)
                    decision = Decision(request_id=f"{s.id}-dispatch-1", option="approve", decided_by="wayne")
                    sent = time.time()
                    await daedalus.decide(client, decision, subject=TicketSubject(ticket_id=s.id))
                    answered = time.time()
                    await parked.result()
                    decides.append(decide_profile(await history(client, parked.id), sent, answered))
                out["decide_alone"] = {
                    k: round(statistics.median(d[k] for d in decides), 2)
                    for k in ("to_scheduled_ms", "queued_ms", "worker_ms", "to_client_ms", "total_ms")
                }
                out["decide_alone"]["n"] = len(decides)
                out["decide_alone"]["local_activities_in_the_update_task"] = decides[-1][
                    "local_activities_in_the_update_task"
                ]
                out["decide_alone"]["audit_events_in_the_update_task"] = decides[-1][
                    "audit_events_in_the_update_task"
                ]
                # (3) CPU of workflow code, under cProfile on the workflow thread
                cpu: dict[str, float] = {}
                for kind in ("bare", "ticket"):
                    thread.run_profiled(thread.profile.enable)
                    before = thread.executor.submit(time.thread_time).result()
                    wall = time.perf_counter()
                    for _ in range(2):
                        if kind == "ticket":
                            await lc.ticket_batch(client, args.tickets)
                        else:
                            await lc.bare_batch(client, args.tickets, shape)
                    wall = time.perf_counter() - wall
                    after = thread.executor.submit(time.thread_time).result()
                    thread.run_profiled(thread.profile.disable)
                    cpu[kind] = after - before
                    out[f"{kind}_batch_wall_s"] = round(wall, 3)
                    if kind == "bare":
                        thread.profile = cProfile.Profile(time.thread_time)  # the ticket's profile alone
                n = 2 * args.tickets
                out["workflow_thread_cpu_ms_per_bare"] = round(cpu["bare"] / n * 1000, 2)
                out["workflow_thread_cpu_ms_per_ticket"] = round(cpu["ticket"] / n * 1000, 2)
                stats = thread.stats()
                out["ticket_profile_total_s"] = round(stats.total_tt, 3)  # type: ignore[attr-defined]
                out["ticket_top_own"] = top(stats, "own_s", args.top)
                out["ticket_top_cumulative"] = top(stats, "cumulative_s", args.top)
                out["tickets_profiled"] = n
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tickets", type=int, default=40, help="per batch (two batches of each kind)")
    parser.add_argument("--decides", type=int, default=9)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--results", type=Path, default=RESULTS / "lifecycle-profile.json")
    args = parser.parse_args()
    if args.tickets < 1 or args.decides < 1:
        raise SystemExit("--tickets and --decides must be at least 1")
    recording = Recording.start()
    out = asyncio.run(measure(args))
    recording.write(out, args.results)


if __name__ == "__main__":
    main()
