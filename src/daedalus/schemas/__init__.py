"""Pydantic models only. No I/O: safe to import inside workflows."""
