"""Hosts: the registry, worker liveness, GPU leases, tenants and engine mirrors."""
