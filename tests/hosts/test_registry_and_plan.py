"""The registry's validation and the pure lease rule (`plan`), without a server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from daedalus.hosts.leases import (
    KeeperState,
    Lease,
    LeaseRequest,
    TenantMode,
    TenantState,
    WaitingLease,
    plan,
)
from daedalus.hosts.registry import (
    Constraint,
    HostSpec,
    RegistryError,
    TenantSpec,
    load_registry,
    parse_registry,
)

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 7, 12, 22, 0, tzinfo=UTC)


def test_the_demo_registry_has_the_seeds_hosts_and_the_pool_cap() -> None:
    registry = load_registry(ROOT / "examples" / "hosts.yaml")
    assert registry.names == ["mavis", "GB10", "local"]
    mavis = registry.host("mavis")
    assert mavis.gpus.count == 4 and not mavis.gpus.unified and mavis.task_queue == "host-mavis"
    assert registry.host("GB10").gpus.unified
    assert [t.name for t in mavis.tenants] == ["comfyui"]
    assert [c.until_ticket for c in registry.constraints_for("GB10")] == ["5"]
    with pytest.raises(
        RegistryError, match=r"unknown host 'locla'; hosts\.yaml declares: mavis, GB10, local"
    ):
        registry.host("locla")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"hosts": [{"name": "a"}, {"name": "a"}]}, "host names must be unique; repeated: ['a']"),
        ({"hosts": [{"name": "a", "gpuz": 1}]}, "hosts.0.gpuz: Extra inputs are not permitted"),
        (
            {
                "hosts": [{"name": "a"}],
                "constraints": [{"id": "c", "setting": "max_len", "op": "<=", "value": 1}],
            },
            "unknown setting 'max_len'; known: enable_prefix_caching",
        ),
        ({"hosts": []}, "hosts: List should have at least 1 item"),
        ([1], "must be a mapping with a `hosts:` list, not list"),
    ],
)
def test_a_bad_registry_says_where(data: object, problem: str) -> None:
    with pytest.raises(RegistryError) as error:
        parse_registry(data, "hosts.yaml")
    assert problem in str(error.value)


def test_a_constraint_reads_each_engines_own_field() -> None:
    cap = Constraint.model_validate({"id": "cap", "setting": "max_model_len", "op": "<=", "value": 16384})
    assert cap.broken_by("vllm", {"max_model_len": 16384}) is None
    assert (
        cap.broken_by("vllm", {"max_model_len": 32768})
        == "max_model_len=32768 breaks cap: max_model_len <= 16384"
    )
    assert cap.broken_by("llama.cpp", {"context": 65536}) is not None
    assert cap.broken_by("llama.cpp", {"parallel": 4}) is None  # the preset does not set it


def state(
    *waiting: LeaseRequest, tenant: TenantState | None = None, held: dict[str, list[int]] | None = None
) -> KeeperState:
    host = HostSpec.model_validate(
        {"name": "h", "gpus": {"count": 4}, "tenants": [tenant.spec] if tenant else []}
    )
    queue = [
        WaitingLease(request=r, seq=i, requested_at=NOW + timedelta(seconds=i), last_heartbeat=NOW)
        for i, r in enumerate(waiting)
    ]
    leases = [
        Lease(
            lease_id=k,
            holder=k,
            purpose="x",
            gpus=v,
            priority=50,
            ttl_s=10,
            requested_at=NOW,
            granted_at=NOW,
            last_heartbeat=NOW,
        )
        for k, v in (held or {}).items()
    ]
    return KeeperState(host=host, waiting=queue, held=leases, tenants=[tenant] if tenant else [])


def req(lease_id: str, **fields: object) -> LeaseRequest:
    return LeaseRequest.model_validate({"lease_id": lease_id, "holder": lease_id, **fields})


RENDER = TenantSpec(name="render", gpus=[2, 3], priority=60, pause="p", resume="r")


def test_any_n_gpus_prefers_those_no_tenant_must_give_up() -> None:
    decided = plan(state(req("a", count=2), tenant=TenantState(spec=RENDER)), NOW)
    assert decided.grants == {"a": [0, 1]} and not decided.pause
    decided = plan(state(req("b", count=2), tenant=TenantState(spec=RENDER), held={"x": [0]}), NOW)
    assert decided.grants == {} and decided.pause == {"render": "b"}


def test_a_busy_tenant_is_paused_only_for_higher_priority() -> None:
    busy = TenantState(spec=RENDER, busy=True)
    assert plan(state(req("low", gpus=[2], priority=60), tenant=busy), NOW).pause == {}
    assert plan(state(req("high", gpus=[2], priority=61), tenant=busy), NOW).pause == {"render": "high"}


def test_a_paused_tenant_resumes_once_nobody_needs_its_gpus() -> None:
    paused = TenantState(spec=RENDER, mode=TenantMode.PAUSED)
    assert plan(state(tenant=paused), NOW).resume == ["render"]
    assert plan(state(tenant=paused, held={"x": [3]}), NOW).resume == []
    waiting = plan(state(req("w", gpus=[2]), tenant=paused, held={"y": [2]}), NOW)
    assert waiting.resume == [] and waiting.grants == {}


def test_reservations_keep_later_requests_off_the_gpus_an_earlier_one_waits_for() -> None:
    decided = plan(state(req("wide", gpus=[0, 1]), req("narrow", gpus=[1]), held={"x": [0]}), NOW)
    assert decided.grants == {}
    decided = plan(state(req("wide", gpus=[0, 1]), req("other", gpus=[2]), held={"x": [0]}), NOW)
    assert decided.grants == {"other": [2]}
