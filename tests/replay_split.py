"""Histories as core writes them when a query is answered while a local activity's result waits for the workflow.

Core then completes the workflow task with the activity's marker, and the commands that the result leads to follow
in the next task. A `workflow.patched` first asked right after such a result sees its marker only in that next task:
on replay the result is delivered a task before core announces the patch, `patched` says False and the replay fails
("Non-deprecated patch marker encountered ..., but there is no corresponding change command!"). Replay tests replay
each history split that way too (`replay_split_too`).

A split adds three events per local activity: a run whose commands depend on its history's length (one that
continues as new when its history grows long) may have decided otherwise had core split it, and its split replay
is no test of patches. Replay such a run's last incarnation split, or a run too short to reach its limit.
"""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, WorkflowReplayResult

LOCAL_ACTIVITY_MARKER = "core_local_activity"
WORKFLOW_TASK_EVENTS = ("SCHEDULED", "STARTED", "COMPLETED")


def split_tasks_after_local_activities(history: WorkflowHistory) -> WorkflowHistory:
    """`history` as core writes it when a query is answered while a local activity's result waits for the
    workflow: the task completes with the activity's marker and the commands that the result leads to follow in
    the next task. Each local-activity marker followed by more commands gets an empty workflow task after it."""
    events: list[dict[str, Any]] = json.loads(history.to_json())["events"]
    first_task = next(e for e in events if e["eventType"] == "EVENT_TYPE_WORKFLOW_TASK_SCHEDULED")
    splits = [
        int(event["eventId"])
        for event, following in pairwise(events)
        if event.get("markerRecordedEventAttributes", {}).get("markerName") == LOCAL_ACTIVITY_MARKER
        and "WORKFLOW_TASK" not in following["eventType"]
    ]

    def new_id(old: int) -> int:
        return old + len(WORKFLOW_TASK_EVENTS) * sum(1 for at in splits if at < old)

    def renumbered(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: str(new_id(int(v))) if k == "eventId" or k.endswith("EventId") else renumbered(v)
                for k, v in node.items()
            }
        return [renumbered(v) for v in node] if isinstance(node, list) else node

    split: list[dict[str, Any]] = []
    for event in events:
        split.append(renumbered(event))
        if int(event["eventId"]) not in splits:
            continue
        first = new_id(int(event["eventId"])) + 1
        attributes = {
            "SCHEDULED": {
                "taskQueue": first_task["workflowTaskScheduledEventAttributes"]["taskQueue"],
                "startToCloseTimeout": "10s",
                "attempt": 1,
            },
            "STARTED": {"scheduledEventId": str(first)},
            "COMPLETED": {"scheduledEventId": str(first), "startedEventId": str(first + 1)},
        }
        for n, kind in enumerate(WORKFLOW_TASK_EVENTS):
            split.append(
                {
                    "eventId": str(first + n),
                    "eventTime": event["eventTime"],
                    "eventType": f"EVENT_TYPE_WORKFLOW_TASK_{kind}",
                    f"workflowTask{kind.title()}EventAttributes": attributes[kind],
                }
            )
    return WorkflowHistory.from_json(history.workflow_id, {"events": split})


def local_activity_markers(history: WorkflowHistory, activity_type: str | None = None) -> int:
    """How many local-activity markers `history` holds; with `activity_type`, only that activity's."""
    return sum(
        1
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER
        and activity_type in (None, local_activity_type(e))
    )


def local_activity_type(event: HistoryEvent) -> str:
    """The activity a local-activity marker records (core keeps it in the marker's `data` detail, as JSON)."""
    [data] = event.marker_recorded_event_attributes.details["data"].payloads
    return str(json.loads(data.data)["activity_type"])


async def replay_split_too(replayer: Replayer, history: WorkflowHistory) -> WorkflowReplayResult:
    """Replay `history` as recorded, then split after its local activities; the result is the unsplit replay's."""
    result = await replayer.replay_workflow(history)
    await replayer.replay_workflow(split_tasks_after_local_activities(history))
    return result
