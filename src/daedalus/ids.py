"""Workflow ids, lease ids and task-queue names, made here and nowhere else.

A ticket lives as workflow `ticket-<id>`, a training run as `training-<name>`, a campaign as `campaign-<id>`; the control queue runs the
workflows and the activities that touch the network or the store, and `host-<name>` the ones that touch a host.
"""

from __future__ import annotations

CONTROL_QUEUE = "daedalus-control"
TICKET_PREFIX = "ticket-"
TRAINING_PREFIX = "training-"
CAMPAIGN_PREFIX = "campaign-"
QUESTION_PREFIX = "question-"
QUESTION_SUBJECT = "question:"
HOST_QUEUE_PREFIX = "host-"


def ticket_workflow_id(ticket_id: str) -> str:
    return f"{TICKET_PREFIX}{ticket_id}"


def training_workflow_id(name: str) -> str:
    """A run's workflow id, which is also its audit subject."""
    return f"{TRAINING_PREFIX}{name}"


def campaign_workflow_id(campaign_id: str) -> str:
    """A campaign's workflow id, which is also its audit subject."""
    return f"{CAMPAIGN_PREFIX}{campaign_id}"


def question_workflow_id(question_id: str) -> str:
    """A question's workflow id (a question belongs to no ticket: daedalus.decisions.questions)."""
    return f"{QUESTION_PREFIX}{question_id}"


def question_subject_key(question_id: str) -> str:
    """A question's audit subject: `question:<id>`, which no ticket id (a slug, no colon) can be."""
    return f"{QUESTION_SUBJECT}{question_id}"


def host_queue(host: str) -> str:
    """The task queue whose workers run on `host` and touch its hardware."""
    return f"{HOST_QUEUE_PREFIX}{host}"


def lease_id_for(owner: str, *parts: str) -> str:
    """Every lease id, one format: the id of the workflow that holds it, then what in it holds it, joined by
    `/` (`ticket-4/1a2b3c4d/attempt-1/decode/round-2`, `campaign-x/<cell>`, `training-y/<run>`). Stable across
    a workflow's retries and continue-as-new as long as its parts are, so acquiring it again is idempotent."""
    if not owner or not all(parts):
        raise ValueError(f"a lease id needs its owner and every part non-empty, got {owner!r} {parts!r}")
    return "/".join((owner, *parts))
