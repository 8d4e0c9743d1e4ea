"""docker-compose.yml keeps step with the registry: one worker service per host of examples/hosts.yaml, and
every Daedalus service mounts the registry where DAEDALUS_HOSTS_FILE points and a policy where
DAEDALUS_POLICY_FILE points (the production stack never runs without one). (No Docker engine here: the same
topology runs as processes in test_pool.py.)"""

from __future__ import annotations

from pathlib import Path

import yaml

from daedalus.decisions.policy import Role, load_policy
from daedalus.hosts.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]


def test_one_worker_service_per_host_and_the_registry_and_policy_mounted_everywhere() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    hosts = load_registry(ROOT / "examples" / "hosts.yaml").names
    workers = {
        name: service
        for name, service in services.items()
        if service.get("command", [])[:2] == ["worker", "--host"]
    }
    assert sorted(service["command"][2] for service in workers.values()) == sorted(hosts)
    for host in hosts:
        assert f"worker-{host.lower()}" in workers
    daedalus = [s for s in services.values() if s.get("build") == "."]
    assert {s["command"][0] for s in daedalus} >= {"api", "worker"}
    for service in daedalus:
        for variable in ("DAEDALUS_HOSTS_FILE", "DAEDALUS_POLICY_FILE"):
            target = service["environment"][variable]
            mounted = any(str(volume).endswith(f":{target}:ro") for volume in service["volumes"])
            assert mounted, (variable, service["command"])


def test_the_default_policy_mount_is_a_valid_policy_for_the_default_registry() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    api = compose["services"]["api"]
    target = api["environment"]["DAEDALUS_POLICY_FILE"]
    (source,) = [str(v) for v in api["volumes"] if str(v).endswith(f":{target}:ro")]
    default = source.split(":-", 1)[1].split("}", 1)[0]
    policy = load_policy(ROOT / default, load_registry(ROOT / "examples" / "hosts.yaml"))
    assert policy.with_role(Role.DECIDER)


def test_every_temporal_client_mounts_the_client_certificates() -> None:
    """Under mTLS every client of the frontend needs its certificate: the one-shot that registers the search
    attributes and the UI as much as Daedalus's own services."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    clients = {
        name
        for name, service in services.items()
        if {"TEMPORAL_ADDRESS", "DAEDALUS_TEMPORAL_ADDRESS"} & set(service.get("environment", {}))
    }
    assert {"temporal-search-attributes", "temporal-ui", "api", "control-worker"} <= clients
    for name in clients:
        volumes = [str(volume) for volume in services[name].get("volumes", [])]
        assert any(volume.endswith(":/etc/daedalus/tls:ro") for volume in volumes), name
