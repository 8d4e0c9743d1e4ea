"""Running a build's or a gate's command confined: the attempt's checkout in a sandbox, under the host's limits.

The command is the ticket's, but what it runs is the agent's code (a `build.sh` its patch added, a test it
wrote), so it runs as an agent's command does: no secrets, no store, no network, nothing writable but its
checkout and a scratch directory of its own, the leased GPUs' devices only, and nothing of it alive after it.
The worker, outside, reads what it printed and writes the verdicts and audit events.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from daedalus.activities.workspace import Workspace
from daedalus.confinement import StepSettings, gpu_device_nodes, limits_line
from daedalus.engines.paths import cache_root
from daedalus.engines.presets import PRESET_DIR
from daedalus.engines.startup_clock import STARTUP_CLOCK_ENV, startup_seconds
from daedalus.processes import Finished, run_logged
from daedalus.sandbox import Sandbox
from daedalus.schemas.gates import LeaseRecord
from daedalus.schemas.steps import ResourceLimits

CPU_TOPOLOGY = (Path("/sys/devices/system/cpu"), Path("/sys/devices/system/node"))
"""Read-only in every build's and gate's sandbox, and nothing else of /sys: the host's CPU and NUMA topology, by
which a CPU engine places its threads (vLLM's CPU build runs `lscpu` as it starts and does not start without it)."""


@dataclass(frozen=True)
class ConfinedSteps:
    workspace: Workspace
    settings: StepSettings
    limits: ResourceLimits
    """The host's: its registry entry's `limits`, else the settings' default."""

    def sandbox(self, ticket_id: str, attempt: int, scratch: Path, lease: LeaseRecord | None) -> Sandbox:
        return Sandbox.for_step(
            self.workspace.worktree(ticket_id, attempt),
            objects=self.workspace.borrowed_objects(ticket_id, attempt),
            scratch=scratch,
            cache=cache_root(),
            read_only=[*self.settings.read_only, *CPU_TOPOLOGY, *checkout_presets()],
            devices=gpu_device_nodes(lease.gpus) if lease is not None else [],
            env=lease.environment() if lease is not None else None,
            tmp_mib=self.limits.tmp_mib,
        )

    async def run(
        self,
        command: str,
        *,
        ticket_id: str,
        attempt: int,
        scratch: Path,
        log_path: Path,
        timeout_s: float,
        heartbeat: Callable[[], None],
        pidfile: Path,
        stdout_path: Path | None = None,
        lease: LeaseRecord | None = None,
        startup_budget_s: float = 0.0,
    ) -> Finished:
        """Run `command` confined. With `startup_budget_s`, `timeout_s` is measuring time: the engine start-ups
        the command records on its start-up clock (engines/startup_clock.py) extend it, up to that budget."""
        sandbox = self.sandbox(ticket_id, attempt, scratch, lease)
        env: dict[str, str] = {}
        extension: Callable[[], float] | None = None
        if startup_budget_s > 0:
            clock = startup_clock_path(scratch)
            clock.unlink(missing_ok=True)  # a retried step times its own starts
            env[STARTUP_CLOCK_ENV] = str(clock.resolve())
            extension = functools.partial(self._startup_s, clock, time.monotonic(), startup_budget_s)
        return await run_logged(
            command,
            cwd=self.workspace.worktree(ticket_id, attempt),
            log_path=log_path,
            stdout_path=stdout_path,
            timeout_s=timeout_s,
            env=env,
            heartbeat=heartbeat,
            pidfile=pidfile,
            sandbox=sandbox,
            limits=self.limits,
            cgroup_root=self.settings.cgroup_root,
            extension=extension,
        )

    @staticmethod
    def _startup_s(clock: Path, since: float, budget_s: float) -> float:
        return startup_seconds(clock, since=since, now=time.monotonic(), budget_s=budget_s)


def checkout_presets() -> list[Path]:
    """A source checkout's `examples/presets/`, where it exists: a gate's bare preset name (`--preset local-f16`)
    resolves there when it runs confined as it does outside (engines/presets.py looks in the engine repo's presets,
    the shipped ones, then these)."""
    return [PRESET_DIR] if PRESET_DIR.is_dir() else []


def startup_clock_path(scratch: Path) -> Path:
    """Where a confined step's measuring process records its engine start-ups (inside its own scratch)."""
    return scratch / "startup-clock"


def limits_note(finished: Finished) -> str:
    """What a step's result says of its limits: the ones it hit, and those the host could not enforce."""
    return limits_line(list(finished.limits_hit), finished.unlimited)
