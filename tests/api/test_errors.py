"""Temporal's answers as HTTP: an update Temporal did not confirm in time is a 504 that says it may still land."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import HTTPException
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError

from daedalus.api.errors import within


async def test_an_update_cut_short_is_a_504_not_a_500() -> None:
    """Seen in bench/chaos.py while Temporal restarted: the SDK turns the cancellation of a pending update into
    its own error, `wait_for` passed that on, and the caller got a 500 instead of "may still be applied"."""

    async def update_that_never_answers() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError as error:  # what temporalio's execute_update does when cancelled
            raise WorkflowUpdateRPCTimeoutOrCancelledError() from error

    with pytest.raises(HTTPException) as refused:
        await within(update_that_never_answers(), 0.05, "4-dispatch-1")
    assert refused.value.status_code == 504
    assert "may still be applied" in str(refused.value.detail)


async def test_an_update_whose_rpc_timed_out_is_a_504() -> None:
    async def rpc_timed_out() -> None:
        raise WorkflowUpdateRPCTimeoutOrCancelledError()

    with pytest.raises(HTTPException) as refused:
        await within(rpc_timed_out(), 5, "4-dispatch-1")
    assert refused.value.status_code == 504
