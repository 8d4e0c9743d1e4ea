"""Patches decided in a run's first activation, for patches that used to be asked first right after a local activity.

Audit writes are local activities (trail.py). A query answered while a local activity's result waits for the
workflow makes core complete the workflow task and force a new one, so the activity's marker and a patch marker
asked right after its result can land in two tasks; on replay the result is delivered in the first, before core
announces the patch it finds in the second, `workflow.patched` says False and the replay fails ("Non-deprecated
patch marker encountered for change ..., but there is no corresponding change command!").

A run started after `at_start` recorded that one patch before any local activity, and every patch gated on it is
on without being asked. A run started before asks each old patch lazily, where it always did (its history has the
marker there, or none), so its history replays as it was recorded.
"""

from __future__ import annotations

from temporalio import workflow


class PatchesAtStart:
    def __init__(self, at_start: str) -> None:
        self.at_start = at_start
        self._on: bool | None = None
        """Whether the run recorded `at_start`: None until `decide`."""

    def decide(self, on: bool = False) -> None:
        """Ask `at_start`: call it first thing in `run`, before anything that awaits. `on`: a patch that implies
        it (a bundle the run recorded) is on, so it is not asked."""
        self._on = on or workflow.patched(self.at_start)

    def patched(self, patch: str) -> bool:
        """Whether `patch` is on: always for a run started after `at_start`; else `workflow.patched(patch)`."""
        return bool(self._on) or workflow.patched(patch)
