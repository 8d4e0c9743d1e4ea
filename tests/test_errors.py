"""One exception tree, one mapping to Temporal: checked on the classes and through real activities on the dev server."""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from temporalio import workflow
from temporalio.api.enums.v1 import RetryState
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from daedalus import errors
from daedalus.activities.notify import NotifyActivities
from daedalus.activities.refs import SUPERVISE_TRAINING
from daedalus.activities.training import TrainingActivities
from daedalus.errors import (
    DaedalusError,
    EngineError,
    InputError,
    PresetError,
    SlackUnavailable,
    TrainingInputError,
    TransientError,
    maps_errors,
)
from daedalus.schemas._base import Model
from daedalus.schemas.notify import NotifyOutcome, NotifyResult
from daedalus.schemas.ticket import DecisionKind, DecisionRequest
from daedalus.schemas.training import CheckpointPolicy, SuperviseInput, TrainingRunSpec
from daedalus.slack.settings import SlackSettings
from tests.slack.fake_slack import FakeSlack, running_fake_slack

TREE = [getattr(errors, name) for name in errors.__all__ if inspect.isclass(getattr(errors, name))]


def test_every_error_is_under_the_root_and_travels_under_its_own_name() -> None:
    assert len(TREE) >= 23
    for cls in TREE:
        assert issubclass(cls, DaedalusError), cls
        assert cls.type_name == cls.__name__
        assert isinstance(cls.retryable, bool)
    assert DaedalusError.type_names() == {cls.type_name for cls in TREE}


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (errors.TicketError("ticket 7 is already running"), False),
        (errors.TrainingRefused("training run r is not live"), False),
        (errors.CampaignRefused("campaign c refused: mallory may not cancel it"), False),
        (errors.GitError("git worktree add failed"), False),
        (errors.ServerDied("llama-server exited 1"), False),
        (errors.BudgetExceeded("spent $5.00 of $5.00"), False),
        (errors.SlackUnavailable("ratelimited"), True),
    ],
)
def test_the_mapping_names_the_class_and_states_retryable_once(error: DaedalusError, retryable: bool) -> None:
    mapped = error.to_application_error()
    assert mapped.type == type(error).__name__ and mapped.message == str(error)
    assert mapped.non_retryable is not retryable


def test_a_failure_is_found_by_its_class_or_any_ancestor() -> None:
    preset = ApplicationError("preset 'tq4' is invalid", type=PresetError.type_name)
    wrapped = ActivityError(
        "activity failed", scheduled_event_id=1, started_event_id=2, identity="w", activity_type="run_benchmark",
        activity_id="1", retry_state=None,
    )  # fmt: skip
    wrapped.__cause__ = preset
    assert PresetError.failure_in(wrapped) is preset
    assert EngineError.failure_in(wrapped) is preset and InputError.failure_in(wrapped) is preset
    assert TrainingInputError.failure_in(wrapped) is None and TransientError.failure_in(preset) is None
    assert TrainingInputError.failure_in(ApplicationError("x", type="ValueError")) is None


async def test_maps_errors_keeps_what_it_wraps_and_lets_other_errors_through() -> None:
    @maps_errors
    async def step(n: int) -> int:
        """A step."""
        if n == 0:
            raise InputError("n must be positive; pass 1 or more")
        if n < 0:
            raise KeyError(n)
        return n * 2

    assert step.__name__ == "step" and step.__doc__ == "A step." and inspect.iscoroutinefunction(step)
    assert await step(2) == 4
    with pytest.raises(ApplicationError) as mapped:
        await step(0)
    assert mapped.value.type == "InputError" and mapped.value.non_retryable
    assert isinstance(mapped.value.__cause__, InputError)
    with pytest.raises(KeyError):
        await step(-1)


# ---- through the dev server: the retry policy allows many attempts; the error's class decides -----------


class Call(Model):
    activity: str
    payload: SuperviseInput | DecisionRequest
    max_attempts: int


@workflow.defn(sandboxed=False)
class CallOnce:
    """Calls one activity by its registered name with a generous retry policy and reports what came back."""

    @workflow.run
    async def run(self, call: Call) -> str:
        result = await workflow.execute_activity(
            call.activity,
            call.payload,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(
                maximum_attempts=call.max_attempts,
                initial_interval=timedelta(milliseconds=100),
                backoff_coefficient=1.0,
            ),
        )
        return json.dumps(result)


async def run_call(client: Client, queue: str, activities: list[Callable[..., Any]], call: Call) -> str:
    async with Worker(client, task_queue=queue, workflows=[CallOnce], activities=activities):
        return await client.execute_workflow(
            CallOnce.run, call, id=f"errors-{uuid.uuid4()}", task_queue=queue
        )


def activity_failure(
    failure: pytest.ExceptionInfo[WorkflowFailureError],
) -> tuple[ActivityError, ApplicationError]:
    cause = failure.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
    return cause, cause.cause


async def test_an_input_error_fails_the_activity_once_however_many_retries_are_allowed(
    temporal_client: Client, task_queue: str, tmp_path: Path
) -> None:
    spec = TrainingRunSpec(
        name="no-trainer",
        host="local",
        command=["no-such-trainer-xyz", "--go"],
        cwd=tmp_path,
        checkpoints=CheckpointPolicy(directory=tmp_path / "ckpt", every_steps=5, keep=2),
        state_dir=tmp_path / "state",
        artifact_dir=tmp_path / "artifacts",
    )
    training = TrainingActivities(tmp_path / "artifacts")
    call = Call(
        activity=SUPERVISE_TRAINING.name, payload=SuperviseInput(spec=spec, incarnation=1), max_attempts=5
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await run_call(temporal_client, task_queue, [training.supervise_training], call)
    activity, cause = activity_failure(failure)
    assert cause.type == TrainingInputError.type_name == "TrainingInputError" and cause.non_retryable
    assert "no-such-trainer-xyz" in cause.message and "not on PATH" in cause.message
    assert activity.retry_state == RetryState.RETRY_STATE_NON_RETRYABLE_FAILURE


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with running_fake_slack() as fake:
        yield fake


def decision_request() -> DecisionRequest:
    return DecisionRequest(
        id="t42-dispatch-1",
        ticket_id="t42",
        kind=DecisionKind.DISPATCH,
        question="Dispatch ticket t42 to scripted on h1?",
        options=["approve", "reject"],
        deciders=["wayne"],
        requested_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
    )


async def test_a_transient_error_is_retried_by_temporal(
    temporal_client: Client, task_queue: str, tmp_path: Path, slack: FakeSlack
) -> None:
    settings = SlackSettings(
        bot_token=SecretStr(slack.token), channel=slack.channels[0], base_url=slack.base_url
    )
    notify = NotifyActivities(settings, tmp_path / "ledger")
    call = Call(activity="notify_decision_request", payload=decision_request(), max_attempts=2)

    # Rate-limited on every try: both allowed attempts run, then Temporal gives up on a retryable failure.
    slack.rate_limit_next = 10
    with pytest.raises(WorkflowFailureError) as failure:
        await run_call(temporal_client, task_queue, [notify.notify_decision_request], call)
    activity, cause = activity_failure(failure)
    assert (
        cause.type == SlackUnavailable.type_name
        and not cause.non_retryable
        and "ratelimited" in cause.message
    )
    assert activity.retry_state == RetryState.RETRY_STATE_MAXIMUM_ATTEMPTS_REACHED
    assert slack.rate_limit_next == 8 and not slack.posts

    # Rate-limited once: Temporal's retry posts it.
    slack.rate_limit_next = 1
    posted = await run_call(temporal_client, task_queue, [notify.notify_decision_request], call)
    assert NotifyResult.model_validate_json(posted).outcome is NotifyOutcome.POSTED
    assert slack.rate_limit_next == 0 and len(slack.posts) == 1


def test_each_subject_refuses_with_its_own_class_under_one_root() -> None:
    """Entry points catch RequestRefused; a training run's or a campaign's refusal is not a ticket's."""
    for cls in (errors.TicketError, errors.TrainingRefused, errors.CampaignRefused, errors.NotAllowed):
        assert issubclass(cls, errors.RequestRefused)
    assert not issubclass(errors.TrainingRefused, errors.TicketError)
    assert not issubclass(errors.CampaignRefused, errors.TicketError)
    assert errors.RequestRefused.type_names() >= {"TicketError", "TrainingRefused", "CampaignRefused"}
