"""The watchdog's sleep between samples: until the next tick, or until a kernel memory notification fires."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import structlog

from daedalus.schemas.training import MemorySource, WatchdogPolicy
from daedalus.training.memory import TrainerCgroup
from daedalus.training.memory_events import PSI_MEMORY, MemoryEvents

log = structlog.get_logger(__name__)

SPURIOUS_WAKEUPS = 100
"""Readiness with nothing to drain this many times in a row: the notifications are dropped for polling."""


class Waker:
    """Sleep until the next sample is due or a kernel notification fires, whichever is first. The notifications'
    epoll descriptor is watched by the event loop itself: nothing runs between them but the samples."""

    def __init__(self, events: MemoryEvents | None):
        self.events = events if events is not None and events.armed else None
        self.fired: list[str] = []
        self._flag = asyncio.Event()
        self._spurious = 0
        self._loop = asyncio.get_running_loop()
        if self.events is not None:
            self._loop.add_reader(self.events.fileno(), self._readable)

    def _readable(self) -> None:
        assert self.events is not None
        names = self.events.drain()
        if names:
            self._spurious = 0
            self.fired += names
            self._flag.set()
            return
        self._spurious += 1
        if self._spurious >= SPURIOUS_WAKEUPS:
            log.warning("memory notifications keep waking with nothing to read: polling instead")
            self._loop.remove_reader(self.events.fileno())

    async def wait(self, timeout_s: float) -> list[str]:
        """The notifications that fired while waiting (empty: the timeout came first)."""
        if not self._flag.is_set() and timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flag.wait(), timeout_s)
        fired, self.fired = self.fired, []
        self._flag.clear()
        return fired

    def close(self) -> None:
        if self.events is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self.events.fileno())
            self.events.close()


def arm_events(policy: WatchdogPolicy, cgroup: TrainerCgroup | None, psi: Path = PSI_MEMORY) -> MemoryEvents:
    """The kernel notifications this run's memory reading can use (see training/memory_events.py)."""
    events = MemoryEvents()
    if not policy.memory_events:
        events.refused.append("memory_events is off in the run's watchdog policy")
        return events
    if cgroup is not None and policy.memory_source is MemorySource.CGROUP:
        usage = cgroup.limit_bytes - policy.threshold_bytes
        if cgroup.unified:
            with contextlib.suppress(OSError):  # the throttle is a help, the notification the point
                (cgroup.path / "memory.high").write_text(str(usage))
            events.add_v2_events(cgroup.path)
            events.add_psi(cgroup.path / "memory.pressure", policy.psi_trigger, f"({cgroup.path.name})")
        else:
            events.add_v1_threshold(cgroup.path, usage)
            events.add_v1_pressure_level(cgroup.path)
            events.add_psi(psi, policy.psi_trigger, "(host-wide)")
    else:
        events.add_psi(psi, policy.psi_trigger, "(host-wide)")
    return events
