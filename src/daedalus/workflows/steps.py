"""Step plumbing shared by the workflows: run a step on a host's queue, let an update interrupt it.

A step that fails after its retries (a host worker lost, a crash) is a `StepFailed` result the workflow
records and moves on from, never a crash of the workflow. An interruption (a ticket's cancel, a run's stop)
cancels the running step, and with it the activity's process group on the host.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, FailureError, TimeoutError, TimeoutType

with workflow.unsafe.imports_passed_through():
    from daedalus.activities.refs import ActivityRef
    from daedalus.hosts.mirrors import ENVIRONMENT_ERROR
    from daedalus.ids import host_queue

In = TypeVar("In")
Out = TypeVar("Out")
T = TypeVar("T")

# Steps heartbeat every 1-2 s; a host worker that died is noticed after this long and the step retried.
STEP_HEARTBEAT = timedelta(seconds=20)
STEP_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=2))


class StepFailure(StrEnum):
    CRASHED = "crashed"
    """The step ran and failed (a crash, a worker lost mid-step) after its retries."""
    ENVIRONMENT = "environment"
    """The host's environment is broken (engine repo unreachable, commit missing): nothing of the work ran."""
    UNSERVED = "unserved"
    """No worker took the step from the host's queue within the host's schedule-to-start limit."""


@dataclass(frozen=True)
class StepFailed:
    """A host step that failed after its retries: recorded, then the workflow moves on."""

    message: str
    kind: StepFailure = StepFailure.CRASHED

    @property
    def is_the_hosts(self) -> bool:
        """The host, not the work, is at fault: no attempt should be spent on it."""
        return self.kind is not StepFailure.CRASHED


def failed_step(error: ActivityError) -> StepFailed:
    """What a host step's ActivityError means: the host unserved, its environment broken, or the step failed."""
    cause = error.cause
    message = str(cause.message if isinstance(cause, FailureError) else error)
    if isinstance(cause, TimeoutError) and cause.type is TimeoutType.SCHEDULE_TO_START:
        return StepFailed(message=message, kind=StepFailure.UNSERVED)
    if isinstance(cause, ApplicationError) and cause.type == ENVIRONMENT_ERROR:
        return StepFailed(message=message, kind=StepFailure.ENVIRONMENT)
    return StepFailed(message=message)


class Interrupted(Exception):
    """The workflow was asked to stop (a ticket's cancel): whatever the running step raised means this."""


class Steps:
    def __init__(self, interrupted: Callable[[], bool]) -> None:
        self._interrupted = interrupted
        self._current: asyncio.Task[Any] | None = None

    def cancel_running(self) -> None:
        """Cancel the step that is running (an update calls this after setting what `interrupted` reads)."""
        if self._current is not None and not self._current.done():
            self._current.cancel()

    async def on_host(
        self,
        ref: ActivityRef[In, Out],
        argument: In,
        *,
        host: str,
        timeout: timedelta,
        heartbeat: timedelta | None = STEP_HEARTBEAT,
        retry: RetryPolicy = STEP_RETRY,
        schedule_to_start: timedelta | None = None,
        interruptible: bool = True,
        summary: str | None = None,
    ) -> Out | StepFailed:
        """Run `ref` on `host`'s queue; a step that fails after its retries is a result, not a crash. With
        `schedule_to_start`, a step no worker takes within it fails as UNSERVED. `interruptible=False` is for
        a step inside a larger one that `run` already makes interruptible (a gate under its lease). `summary`
        labels the step's bar in the Temporal UI's timeline."""
        call = ref.execute(
            argument,
            task_queue=host_queue(host),
            start_to_close_timeout=timeout,
            schedule_to_start_timeout=schedule_to_start,
            heartbeat_timeout=heartbeat,
            retry_policy=retry,
            summary=summary,
        )
        try:
            return await (self.run(call) if interruptible else call)
        except ActivityError as error:
            return failed_step(error)

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Run one step so that an interruption can cancel it. Once interrupted, whatever the step raises
        (CancelledError, or the ActivityError or ChildWorkflowError that wraps it) means `Interrupted`."""
        self.raise_if_interrupted(awaitable)
        task = asyncio.ensure_future(awaitable)
        self._current = task
        try:
            return await task
        except BaseException:
            if self._interrupted():
                raise Interrupted() from None
            raise
        finally:
            self._current = None

    def raise_if_interrupted(self, pending: object = None) -> None:
        if not self._interrupted():
            return
        if inspect.iscoroutine(pending):
            pending.close()  # never started: close it rather than leave it unawaited
        raise Interrupted()


def history_is_long(limit: int) -> bool:
    """Time to continue as new: past `limit` events, or when the server suggests it."""
    info = workflow.info()
    return info.get_current_history_length() >= limit or info.is_continue_as_new_suggested()


class SearchAttributesMirror:
    """Mirrors state in the Temporal UI's search attributes; upserts only changed values (each is a write).

    A value of None clears the attribute when the run has it (a legacy attribute), and only along with another
    change, so clearing it never adds an upsert of its own to a history recorded before it was cleared."""

    def __init__(self) -> None:
        # What the run started with: the starter sets a ticket's identity, continue-as-new keeps them all.
        self.published: dict[str, Any] = {
            pair.key.name: pair.value for pair in workflow.info().typed_search_attributes
        }

    def publish(self, values: Mapping[SearchAttributeKey[Any], Any]) -> None:
        changed: list[SearchAttributeUpdate[Any]] = [
            key.value_set(v)
            for key, v in values.items()
            if v is not None and self.published.get(key.name) != v
        ]
        if not changed:
            return
        cleared = [key for key, v in values.items() if v is None and key.name in self.published]
        workflow.upsert_search_attributes([*changed, *(key.value_unset() for key in cleared)])
        self.published.update({key.name: v for key, v in values.items() if v is not None})
        for key in cleared:
            del self.published[key.name]
