"""Inference engines: build, launch, benchmark and probe them the way MEASUREMENT.md says."""
