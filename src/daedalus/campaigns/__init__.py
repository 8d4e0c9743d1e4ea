"""Campaigns: sweep presets x workloads on a host, measure each cell like a gate, propose the Pareto-best."""
