"""Kernel memory notifications that wake the training watchdog between its samples.

The watchdog samples memory on an interval (1 Hz by default). A trainer that allocates 2 GiB/s can go from fine
to OOM-killed between two samples, and sampling ten times faster costs ten times the CPU, all the time, to catch
a rare event. So, as systemd-oomd does, the watchdog also asks the kernel to tell it when memory gets tight, and
samples at once when it does (`MemoryEvents`, one epoll descriptor the watchdog's event loop waits on):

* the trainer's own memory cgroup crossing the watchdog's threshold: on cgroup v1, a usage threshold
  (`cgroup.event_control`: an eventfd, `memory.usage_in_bytes` and the usage the threshold stands for; the
  kernel signals every crossing, up or down); on cgroup v2, `memory.high` set at the threshold and
  `memory.events` polled for POLLPRI (its `high` counter moves as usage crosses it; the kernel also throttles
  the trainer above it);
* memory pressure: a PSI trigger (`some 150000 1000000`: 150 ms of stall in any 1 s) written to
  `/proc/pressure/memory`, or to the trainer's v2 cgroup's `memory.pressure`, and polled for POLLPRI. Without
  CAP_SYS_RESOURCE the kernel takes only windows that are multiples of 2 s (and checks them on its 2 s averaging
  clock); the trigger is then scaled to the shortest such window, and `describe` says so;
* cgroup v1's `memory.pressure_level` at `medium` (the cgroup is reclaiming).

Each source that could not be armed is named with the kernel's reason; with none, the watchdog polls on its
interval only, and says that too.
"""

from __future__ import annotations

import contextlib
import os
import select
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

PSI_MEMORY = Path("/proc/pressure/memory")
UNPRIVILEGED_WINDOW_US = 2_000_000
"""Without CAP_SYS_RESOURCE, a PSI trigger's window must be a multiple of this (kernel/sched/psi.c)."""


class SourceKind(StrEnum):
    EVENTFD = "eventfd"
    """cgroup v1 notifications: read the eventfd's counter to re-arm it."""
    KERNFS = "kernfs"
    """A cgroup v2 file (memory.events): POLLPRI until it is read again."""
    PSI = "psi"
    """A PSI trigger: POLLPRI, re-armed by the poll itself."""


@dataclass(frozen=True)
class Source:
    name: str
    kind: SourceKind
    fd: int
    extra_fds: tuple[int, ...] = ()
    """Descriptors the notification needs kept open (the v1 control and target files)."""


class MemoryEvents:
    """The notifications armed for one watched trainer; `fileno()` is readable when any has fired."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._sources: dict[int, Source] = {}
        self.refused: list[str] = []

    # ---- arming -------------------------------------------------------------------------------------------

    def add_psi(self, path: Path, trigger: str, label: str) -> bool:
        """A PSI trigger on `path`; scaled to a 2 s window when the kernel refuses a shorter one unprivileged."""
        refusal = ""
        for candidate in _psi_candidates(trigger):
            try:
                fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as error:
                self.refused.append(f"PSI trigger on {path}: cannot open it ({error.strerror})")
                return False
            try:
                os.write(fd, candidate.encode() + b"\0")
            except OSError as error:
                os.close(fd)
                refusal += f"{'; ' if refusal else ''}{candidate!r}: {error.strerror}"
                continue
            note = ""
            if candidate != trigger:
                note = (
                    f"; {trigger!r} was refused (a window under 2 s needs CAP_SYS_RESOURCE), so the kernel checks "
                    "this one on its 2 s averaging clock"
                )
            self._register(Source(f"PSI {label} {candidate!r}{note}", SourceKind.PSI, fd), select.EPOLLPRI)
            return True
        self.refused.append(f"PSI trigger on {path}: the kernel refused {refusal}")
        return False

    def add_v1_threshold(self, cgroup: Path, usage_bytes: int) -> bool:
        """Notified whenever the v1 memory cgroup's usage crosses `usage_bytes`, either way."""
        return self._add_v1(cgroup, "memory.usage_in_bytes", str(usage_bytes),
                            f"cgroup v1 usage threshold {usage_bytes / 2**30:.2f} GiB ({cgroup.name})")  # fmt: skip

    def add_v1_pressure_level(self, cgroup: Path, level: str = "medium") -> bool:
        """Notified when the v1 memory cgroup reclaims at `level` (low, medium, critical)."""
        return self._add_v1(cgroup, "memory.pressure_level", level, f"cgroup v1 pressure level {level}")

    def add_v2_events(self, cgroup: Path) -> bool:
        """POLLPRI whenever a counter of the v2 cgroup's memory.events moves (high, max, oom, oom_kill)."""
        try:
            fd = os.open(cgroup / "memory.events", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.pread(fd, 4096, 0)  # the poll reports changes after the last read
        except OSError as error:
            self.refused.append(f"cgroup v2 memory.events of {cgroup}: {error.strerror}")
            return False
        self._register(
            Source(f"cgroup v2 memory.events ({cgroup.name})", SourceKind.KERNFS, fd), select.EPOLLPRI
        )
        return True

    def _add_v1(self, cgroup: Path, target: str, argument: str, name: str) -> bool:
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        opened: list[int] = []
        try:
            opened.append(os.open(cgroup / target, os.O_RDONLY | os.O_CLOEXEC))
            opened.append(os.open(cgroup / "cgroup.event_control", os.O_WRONLY | os.O_CLOEXEC))
            os.write(opened[1], f"{efd} {opened[0]} {argument}".encode())
        except OSError as error:
            for fd in (efd, *opened):
                os.close(fd)
            self.refused.append(f"{name}: {error.strerror}")
            return False
        self._register(Source(name, SourceKind.EVENTFD, efd, tuple(opened)), select.EPOLLIN)
        return True

    def _register(self, source: Source, mask: int) -> None:
        self._epoll.register(source.fd, mask)
        self._sources[source.fd] = source

    # ---- waiting ------------------------------------------------------------------------------------------

    @property
    def armed(self) -> list[str]:
        return [source.name for source in self._sources.values()]

    def fileno(self) -> int:
        return self._epoll.fileno()

    def drain(self) -> list[str]:
        """The sources that fired since the last drain, each re-armed."""
        fired = []
        for fd, _ in self._epoll.poll(0):
            source = self._sources.get(fd)
            if source is None:
                continue
            with contextlib.suppress(OSError):
                if source.kind is SourceKind.EVENTFD:
                    os.read(fd, 8)
                elif source.kind is SourceKind.KERNFS:
                    os.pread(fd, 4096, 0)
            fired.append(source.name)
        return fired

    def describe(self, interval_s: float) -> str:
        """Which mechanism wakes the watchdog: the notifications armed, or polling; and what was refused."""
        if self._sources:
            how = f"kernel notifications ({'; '.join(self.armed)}) and a sample every {interval_s:g} s"
        else:
            how = f"polling: a sample every {interval_s:g} s (no kernel notification could be armed)"
        if self.refused:
            how += f"; not armed: {'; '.join(self.refused)}"
        return how

    def close(self) -> None:
        for source in self._sources.values():
            for fd in (source.fd, *source.extra_fds):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._sources.clear()
        self._epoll.close()

    def __enter__(self) -> MemoryEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _psi_candidates(trigger: str) -> list[str]:
    """The trigger as written, then scaled to the shortest window an unprivileged writer may use."""
    kind, stall, window = trigger.split()
    stall_us, window_us = int(stall), int(window)
    candidates = [trigger]
    if window_us % UNPRIVILEGED_WINDOW_US:
        scaled_window = (window_us // UNPRIVILEGED_WINDOW_US + 1) * UNPRIVILEGED_WINDOW_US
        scaled_stall = max(1, stall_us * scaled_window // window_us)
        candidates.append(f"{kind} {scaled_stall} {scaled_window}")
    return candidates
