"""Lease ids come from one place in one format, and the two lease calls a workflow makes have their own types
(which still read the payload of the one `LeaseCall` both shared, for activities scheduled before the split)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from daedalus.hosts.leases import LeaseAcquire, LeaseRelease, LeaseRequest
from daedalus.ids import campaign_workflow_id, lease_id_for, ticket_workflow_id, training_workflow_id


def test_every_lease_id_is_its_workflow_then_its_parts() -> None:
    gate = lease_id_for(ticket_workflow_id("4"), "1a2b3c4d", "attempt-1", "decode", "round-2")
    assert gate == "ticket-4/1a2b3c4d/attempt-1/decode/round-2"  # the format tickets' leases always had
    assert (
        lease_id_for(campaign_workflow_id("x"), "kv=q8_0/context=4096") == "campaign-x/kv=q8_0/context=4096"
    )
    assert lease_id_for(training_workflow_id("y"), "0f1e2d3c") == "training-y/0f1e2d3c"
    assert lease_id_for("pool-bench", "gate-3") == "pool-bench/gate-3"


@pytest.mark.parametrize(("owner", "parts"), [("", ("a",)), ("ticket-4", ("a", "")), ("", ())])
def test_an_empty_owner_or_part_is_refused(owner: str, parts: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        lease_id_for(owner, *parts)
    assert lease_id_for("ticket-4") == "ticket-4"  # a workflow holding one lease may name it by itself


REQUEST = LeaseRequest(lease_id="ticket-4/x", holder="ticket 4 gate decode", gpus=[0])


def test_the_old_shared_payload_still_reads_as_either_call() -> None:
    """What a worker from before the split scheduled: one LeaseCall with every field of both calls."""
    acquire = {
        "host": "mavis",
        "request": REQUEST.model_dump(mode="json"),
        "lease_id": "",
        "reason": "released",
    }
    assert LeaseAcquire.model_validate(acquire) == LeaseAcquire(host="mavis", request=REQUEST)
    release = {"host": "mavis", "request": None, "lease_id": "ticket-4/x", "reason": "released"}
    assert LeaseRelease.model_validate(release) == LeaseRelease(host="mavis", lease_id="ticket-4/x")


def test_each_call_has_what_it_needs_and_nothing_else() -> None:
    with pytest.raises(ValidationError, match="request"):
        LeaseAcquire.model_validate({"host": "mavis"})
    with pytest.raises(ValidationError, match="lease_id"):
        LeaseRelease.model_validate({"host": "mavis", "lease_id": ""})
    with pytest.raises(ValidationError, match="request"):  # a release that carries a request is a mix-up
        LeaseRelease.model_validate({"host": "mavis", "lease_id": "x", "request": REQUEST.model_dump()})
