"""The lease keeper on the real dev server: grants, FIFO, priorities, no starvation, expiry, races."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest
from temporalio.client import Client

from daedalus.hosts import holder
from daedalus.hosts.leases import LeaseRequest, LeaseStatus
from tests.hosts.keeper_support import running_keeper, until_queued


def request(lease_id: str, **fields: object) -> LeaseRequest:
    fields.setdefault("gpus", [0])
    return LeaseRequest.model_validate(
        {"lease_id": lease_id, "holder": f"test {lease_id}", "ttl_s": 10, **fields}
    )


async def test_second_lease_on_a_gpu_waits_for_the_first(temporal_client: Client, tmp_path: Path) -> None:
    async with running_keeper(temporal_client, tmp_path) as keeper:
        first = await holder.acquire(temporal_client, keeper.host, request("a", gpus=[0, 1]))
        assert first.status is LeaseStatus.GRANTED and first.gpus == [0, 1]
        other = await holder.acquire(temporal_client, keeper.host, request("b", gpus=[2]))
        assert other.gpus == [2]
        second = asyncio.create_task(holder.acquire(temporal_client, keeper.host, request("c", gpus=[1])))
        await until_queued(temporal_client, keeper.host, "c")
        await asyncio.sleep(0.4)  # the grant's wait is measured from its arrival
        assert not second.done()
        state = await holder.keeper_state(temporal_client, keeper.host)
        assert [w.request.lease_id for w in state.waiting] == ["c"]
        await holder.release(temporal_client, keeper.host, "a")
        granted = await asyncio.wait_for(second, 10)
        assert granted.gpus == [1]
        assert granted.wait_ms is not None and granted.wait_ms >= 400


async def test_fifo_within_a_priority_and_higher_priority_first(
    temporal_client: Client, tmp_path: Path
) -> None:
    async with running_keeper(temporal_client, tmp_path, gpus=1) as keeper:
        await holder.acquire(temporal_client, keeper.host, request("hold"))
        order: list[str] = []

        async def take(lease_id: str, priority: int) -> None:
            await holder.acquire(temporal_client, keeper.host, request(lease_id, priority=priority))
            order.append(lease_id)
            await holder.release(temporal_client, keeper.host, lease_id)

        tasks = []
        for lease_id, priority in [("low-1", 10), ("low-2", 10), ("high", 90), ("low-3", 10)]:
            tasks.append(asyncio.create_task(take(lease_id, priority)))
            await until_queued(
                temporal_client, keeper.host, lease_id
            )  # arrival order is the order of these calls
        await holder.release(temporal_client, keeper.host, "hold")
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        assert order == ["high", "low-1", "low-2", "low-3"]


async def test_a_wide_request_is_not_starved_by_narrow_ones(temporal_client: Client, tmp_path: Path) -> None:
    async with running_keeper(temporal_client, tmp_path, gpus=2) as keeper:
        await holder.acquire(temporal_client, keeper.host, request("n0", gpus=[0]))
        wide = asyncio.create_task(holder.acquire(temporal_client, keeper.host, request("wide", gpus=[0, 1])))
        await until_queued(temporal_client, keeper.host, "wide")
        # GPU 1 is free, but reserved for the wide request that arrived first: a later narrow one must wait.
        narrow = asyncio.create_task(holder.acquire(temporal_client, keeper.host, request("n1", gpus=[1])))
        await until_queued(temporal_client, keeper.host, "n1")
        assert not wide.done() and not narrow.done()
        await holder.release(temporal_client, keeper.host, "n0")
        assert (await asyncio.wait_for(wide, 10)).gpus == [0, 1]
        assert not narrow.done()
        await holder.release(temporal_client, keeper.host, "wide")
        assert (await asyncio.wait_for(narrow, 10)).gpus == [1]


async def test_aging_lifts_a_low_priority_request_over_newer_high_ones(
    temporal_client: Client, tmp_path: Path
) -> None:
    async with running_keeper(temporal_client, tmp_path, gpus=1, aging_s=0.5) as keeper:
        await holder.acquire(temporal_client, keeper.host, request("hold"))
        low = asyncio.create_task(holder.acquire(temporal_client, keeper.host, request("low", priority=10)))
        await until_queued(temporal_client, keeper.host, "low")
        await asyncio.sleep(2.5)  # at least 5 aging steps since its arrival: effective priority >= 15 > 12
        high = asyncio.create_task(holder.acquire(temporal_client, keeper.host, request("high", priority=12)))
        await until_queued(temporal_client, keeper.host, "high")
        await holder.release(temporal_client, keeper.host, "hold")
        assert (await asyncio.wait_for(low, 10)).status is LeaseStatus.GRANTED
        state = await holder.keeper_state(temporal_client, keeper.host)
        assert [w.request.lease_id for w in state.waiting] == ["high"] and not high.done()
        await holder.release(temporal_client, keeper.host, "low")
        await asyncio.wait_for(high, 10)


async def test_a_dead_holders_lease_expires_and_the_gpu_goes_to_the_next(
    temporal_client: Client, tmp_path: Path
) -> None:
    async with running_keeper(temporal_client, tmp_path) as keeper:
        await holder.acquire(temporal_client, keeper.host, request("dead", ttl_s=1.0))
        # Until its first keepalive a grant lives a minute (its holder may be slow to see it); then the ttl.
        state = await holder.keeper_state(temporal_client, keeper.host)
        assert state.held[0].live_s == 60
        await holder.keepalive(temporal_client, keeper.host, "dead")
        started = time.monotonic()
        nxt = await asyncio.wait_for(holder.acquire(temporal_client, keeper.host, request("next")), 15)
        waited = time.monotonic() - started
        assert nxt.gpus == [0] and 0.8 <= waited < 30  # not before its ttl; the rest is the machine's load
        state = await holder.keeper_state(temporal_client, keeper.host)
        assert state.counters.expired == 1
        assert [e.kind.value for e in state.events if e.lease_id == "dead"] == ["granted", "expired"]
        lost = await holder.heartbeat(temporal_client, keeper.host, "dead")
        assert lost.status is LeaseStatus.UNKNOWN and "expired" in lost.reason


async def test_concurrent_holders_never_overlap_on_a_gpu(temporal_client: Client, tmp_path: Path) -> None:
    async with running_keeper(temporal_client, tmp_path, gpus=3) as keeper:
        intervals: list[tuple[int, float, float, str]] = []

        async def step(i: int) -> None:
            req = (
                request(f"s{i}", gpus=None, count=1 + i % 2, priority=10 * (i % 3))
                if i % 3
                else request(f"s{i}", gpus=[i % 3, (i + 1) % 3])
            )
            async with holder.holding(temporal_client, keeper.host, req) as lease:
                start = time.monotonic()
                await asyncio.sleep(0.05)
                end = time.monotonic()
                intervals.extend((gpu, start, end, req.lease_id) for gpu in lease.gpus)

        await asyncio.wait_for(asyncio.gather(*(step(i) for i in range(24))), 90)
        assert len({lease for *_, lease in intervals}) == 24
        for gpu in range(3):
            spans = sorted((s, e) for g, s, e, _ in intervals if g == gpu)
            assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
        state = await holder.keeper_state(temporal_client, keeper.host)
        assert state.held == [] and state.waiting == [] and state.counters.granted == 24


async def test_gpus_that_do_not_exist_are_refused(temporal_client: Client, tmp_path: Path) -> None:
    async with running_keeper(temporal_client, tmp_path, gpus=2) as keeper:
        with pytest.raises(holder.LeaseRefused, match=r"GPU\(s\) \[5\] do not exist; the host has 2"):
            await holder.acquire(temporal_client, keeper.host, request("x", gpus=[0, 5]))
        with pytest.raises(holder.LeaseRefused, match="3 GPU"):
            await holder.acquire(temporal_client, keeper.host, request("y", gpus=None, count=3))


async def test_waiting_too_long_is_refused_with_who_holds_the_gpus(
    temporal_client: Client, tmp_path: Path
) -> None:
    async with running_keeper(temporal_client, tmp_path, gpus=1) as keeper:
        await holder.acquire(temporal_client, keeper.host, request("hog"))
        with pytest.raises(
            holder.LeaseRefused, match=r"not granted within 1s; held by test hog on GPUs \[0\]"
        ):
            await holder.acquire(temporal_client, keeper.host, request("late", wait_timeout_s=1))


async def test_state_survives_continue_as_new(temporal_client: Client, tmp_path: Path) -> None:
    async with running_keeper(temporal_client, tmp_path, gpus=2, max_history=60) as keeper:
        handle = temporal_client.get_workflow_handle(f"lease-keeper-{keeper.host}")
        first_run = (await handle.describe()).run_id
        async with holder.holding(temporal_client, keeper.host, request("long", ttl_s=3)) as lease:
            for i in range(15):
                async with holder.holding(temporal_client, keeper.host, request(f"c{i}", gpus=[1])):
                    pass
            assert lease.lost is None
            state = await holder.keeper_state(temporal_client, keeper.host)
            assert [held.lease_id for held in state.held] == ["long"]
            assert state.counters.granted == 16
        assert (await handle.describe()).run_id != first_run
