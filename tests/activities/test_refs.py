"""Each activity a workflow calls is declared once (activities/refs.py): the definitions the workers register
carry the declared name, take the declared input and return the declared output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from temporalio import activity

from daedalus.activities.attempts import AttemptActivities
from daedalus.activities.audit import AuditActivities
from daedalus.activities.builds import BuildActivities
from daedalus.activities.gates import GateActivities
from daedalus.activities.hosts import (
    KeeperStoreActivities,
    LeaseActivities,
    LeasedCommandActivities,
    TenantActivities,
)
from daedalus.activities.lessons import LessonActivities
from daedalus.activities.notify import NotifyActivities
from daedalus.activities.refs import WORKFLOW_ACTIVITIES, ActivityRef
from daedalus.activities.report import ReportActivities
from daedalus.activities.training import TrainingActivities

DEFINITIONS: list[Callable[..., Any]] = [
    AttemptActivities.run_attempt,
    BuildActivities.run_build,
    GateActivities.run_gate,
    AuditActivities.record_audit_event,
    AuditActivities.record_audit_events,
    NotifyActivities.notify_decision_request,
    TrainingActivities.supervise_training,
    TrainingActivities.training_host_report,
    TrainingActivities.evaluate_checkpoint,
    TrainingActivities.deploy_checkpoint,
    LessonActivities.record_lessons,
    LessonActivities.lessons_for,
    ReportActivities.post_report_digest,
    LeaseActivities.acquire_lease,
    LeaseActivities.release_lease,
    TenantActivities.pause_tenant,
    TenantActivities.resume_tenant,
    KeeperStoreActivities.passed_tickets,
    LeasedCommandActivities.run_leased,
]


def definition(fn: Callable[..., Any]) -> activity._Definition:
    found = activity._Definition.from_callable(fn)
    assert found is not None, fn
    return found


def test_every_declared_activity_has_one_definition() -> None:
    names = sorted(definition(fn).name for fn in DEFINITIONS)
    assert names == sorted(ref.name for ref in WORKFLOW_ACTIVITIES)


@pytest.mark.parametrize("ref", WORKFLOW_ACTIVITIES, ids=lambda ref: ref.name)
def test_declared_types_match_the_definition(ref: ActivityRef[Any, Any]) -> None:
    [fn] = [fn for fn in DEFINITIONS if definition(fn).name == ref.name]
    found = definition(fn)
    assert found.arg_types is not None and found.arg_types[-1:] == [ref.input]
    assert found.ret_type == ref.output  # == : list[str] is a new alias object each time it is written
