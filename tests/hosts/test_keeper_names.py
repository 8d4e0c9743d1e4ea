"""hosts/holder.py calls the lease keeper by name (it sits below the workflows, so it never imports the class):
each name it uses must be the one LeaseKeeperWorkflow defines, for the handler of the kind it calls."""

from __future__ import annotations

from temporalio import workflow

from daedalus.hosts import holder
from daedalus.workflows.lease_keeper import LeaseKeeperWorkflow

KEEPER = workflow._Definition.must_from_class(LeaseKeeperWorkflow)


def test_the_keeper_is_called_by_its_workflow_type() -> None:
    assert KEEPER.name == holder.KEEPER_WORKFLOW


def test_every_update_query_and_signal_the_holder_calls_is_the_keepers() -> None:
    assert {
        holder.CONFIGURE,
        holder.ACQUIRE,
        holder.RELEASE,
        holder.TENANT_DEMAND,
        holder.RECORD_HOST_CHECK,
    } == set(KEEPER.updates)
    assert {holder.LEASE, holder.STATE} == set(KEEPER.queries)
    assert {holder.KEEPALIVE, holder.TICKET_PASSED} == set(KEEPER.signals)


def test_a_name_of_the_wrong_kind_is_caught() -> None:
    """The check above can fail: a signal's name is not an update's."""
    assert holder.KEEPALIVE not in KEEPER.updates and holder.ACQUIRE not in KEEPER.signals
