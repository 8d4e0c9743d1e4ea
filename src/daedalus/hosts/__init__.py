"""Hosts: the registry, worker liveness, GPU leases, tenants, engine mirrors, and the offline host bundle."""
