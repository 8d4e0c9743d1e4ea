"""The lease keeper keeps its host's last check (`record_host_check`) and answers with its clock; a keeper that
kept one replays from its stored history. Re-record only for a change meant to be incompatible:

    DAEDALUS_RECORD_HISTORIES=1 .venv/bin/pytest tests/hosts/test_keeper_host_check.py -k record
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory, WorkflowUpdateFailedError
from temporalio.worker import Replayer

from daedalus.hosts import holder
from daedalus.hosts.check import judge_clock, record
from daedalus.hosts.leases import keeper_id
from daedalus.payloads import DATA_CONVERTER
from daedalus.schemas.host_check import CheckLine, CheckStatus, HostCheck
from daedalus.workflows.lease_keeper import LeaseKeeperWorkflow
from tests.hosts.keeper_support import running_keeper
from tests.replay_split import replay_split_too

STORED = Path(__file__).parent / "histories" / "lease-keeper-host-check.json"


def replayer() -> Replayer:
    return Replayer(workflows=[LeaseKeeperWorkflow], data_converter=DATA_CONVERTER)


async def test_stored_history_with_a_host_check_replays() -> None:
    history = WorkflowHistory.from_json("lease-keeper-host-check", STORED.read_text())
    await replay_split_too(replayer(), history)


async def test_record_a_keeper_that_keeps_its_hosts_check(temporal_client: Client, tmp_path: Path) -> None:
    async with running_keeper(temporal_client, tmp_path) as keeper:
        check = HostCheck(
            host=keeper.host,
            checked_at=datetime.now(UTC),
            checked_by="test",
            lines=[
                CheckLine(name="sandbox", status=CheckStatus.OK, detail="every namespace unshared"),
                CheckLine(
                    name="gpus", status=CheckStatus.FAIL, detail="none readable", fix="install the driver"
                ),
            ],
        )
        receipt, sent, received = await record(temporal_client, check)
        assert judge_clock(sent, received, receipt.received_at).status is CheckStatus.OK
        kept = (await holder.keeper_state(temporal_client, keeper.host)).last_check
        assert kept is not None and kept.check == check and kept.received_at == receipt.received_at
        assert abs(receipt.received_at - datetime.now(UTC)) < timedelta(seconds=30)
        handle = temporal_client.get_workflow_handle(keeper_id(keeper.host))
        with pytest.raises(WorkflowUpdateFailedError):  # refused before anything is written
            await handle.execute_update(
                LeaseKeeperWorkflow.record_host_check, HostCheck(host="another", checked_at=datetime.now(UTC))
            )
        history = await handle.fetch_history()
    await replay_split_too(replayer(), history)
    if os.environ.get("DAEDALUS_RECORD_HISTORIES"):
        STORED.write_text(history.to_json())
