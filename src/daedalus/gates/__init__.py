"""How a gate decides (shared/design/MEASUREMENT.md): statistics over raw samples, then a verdict."""
