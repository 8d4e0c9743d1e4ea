"""Memory readings for the training watchdog, and the robust leak slope fitted to them.

Production reads host-wide MemAvailable: on unified-memory hosts (GB10) GPU allocations are invisible to
cgroups and to RSS, but they do lower MemAvailable. Tests read `budget - RSS of the trainer's process tree`
so that a trainer allocating a few hundred MiB trips the stop without pushing a shared machine near OOM.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import psutil
from scipy.stats import theilslopes

from daedalus.schemas.training import GIB, MIB, MemorySource, WatchdogPolicy

MAX_FIT_POINTS = 90
"""The window is reduced to at most this many bucket medians before the fit: Theil-Sen is O(n^2) in pairs."""


class MemoryReader(Protocol):
    def available_bytes(self) -> int: ...


class HostMemory:
    """Host-wide MemAvailable."""

    def available_bytes(self) -> int:
        return int(psutil.virtual_memory().available)


class ProcessTreeMemory:
    """`budget` minus the RSS of `root` and all its descendants."""

    def __init__(self, root_pid: int, budget_bytes: int):
        self.root_pid = root_pid
        self.budget_bytes = budget_bytes

    def used_bytes(self) -> int:
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue  # a child that exited between the listing and the reading uses nothing
        return total

    def available_bytes(self) -> int:
        return self.budget_bytes - self.used_bytes()


def reader_for(policy: WatchdogPolicy, trainer_pid: int) -> MemoryReader:
    if policy.memory_source is MemorySource.PROCESS_TREE:
        assert policy.budget_mib is not None  # the schema enforces it
        return ProcessTreeMemory(trainer_pid, policy.budget_mib * MIB)
    return HostMemory()


def read_psi_some_avg10(path: Path = Path("/proc/pressure/memory")) -> float | None:
    """`some avg10` of memory pressure, or None where PSI is absent or unreadable (older kernels, containers)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                key, _, value = field.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


@dataclass(frozen=True)
class OomCounters:
    """The kernel's OOM-kill counters at one moment: host-wide (/proc/vmstat) and the memory cgroup's own
    (cgroup v2 memory.events, or v1 memory.oom_control), with the cgroup file read."""

    vmstat: int | None = None
    cgroup: int | None = None
    cgroup_file: str | None = None


def cgroup_oom_file(pid: int, proc: Path = Path("/proc"), root: Path = Path("/sys/fs/cgroup")) -> Path | None:
    """The file that counts OOM kills in `pid`'s memory cgroup, where one is readable."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if "memory" in controllers.split(","):  # cgroup v1
            candidate = root / "memory" / rel / "memory.oom_control"
        elif controllers == "":  # cgroup v2
            candidate = root / rel / "memory.events"
        else:
            continue
        if candidate.is_file():
            return candidate
    return None


def read_counter_file(path: Path, key: str = "oom_kill") -> int | None:
    """`key N` from a "key value" per line file (vmstat, memory.events, memory.oom_control)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def oom_counters(cgroup_file: Path | None, vmstat: Path = Path("/proc/vmstat")) -> OomCounters:
    return OomCounters(
        vmstat=read_counter_file(vmstat),
        cgroup=read_counter_file(cgroup_file) if cgroup_file is not None else None,
        cgroup_file=str(cgroup_file) if cgroup_file is not None else None,
    )


def kernel_log_oom(pid: int, kmsg: Path = Path("/dev/kmsg"), limit: int = 50_000) -> str | None:
    """The kernel log's OOM-kill record of `pid` ("Killed process PID" or "oom-kill:... pid=PID"), or None.

    /dev/kmsg is read without blocking from the oldest record kept; where it cannot be read (no permission,
    no such device), there is no evidence from it.
    """
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found = None
    try:
        for _ in range(limit):
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except BrokenPipeError:  # records overwritten while reading: go on from the next one
                continue
            except OSError:
                break
            if not record:
                break
            # One record per read from /dev/kmsg ("prio,seq,time,flags;message"); a saved copy reads as lines.
            for line in record.splitlines():
                message = line.partition(";")[2]
                if f"Killed process {pid} " in message or (
                    message.startswith("oom-kill:") and f",pid={pid}," in message
                ):
                    found = message.strip()
    finally:
        os.close(fd)
    return found


class Nvml:
    """GPU memory in use, when pynvml is importable and the device answers; NOT_SUPPORTED (unified memory) is
    remembered and never asked again."""

    def __init__(self) -> None:
        self.status = "absent"
        self._handles: list[object] = []
        self._nvml: Any = None
        try:
            import pynvml  # type: ignore[import-not-found]
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = pynvml
            self.status = "ok"
        except Exception as exc:  # pynvml raises its own NVMLError family; any failure means "no reading"
            self.status = f"error: {exc}"

    def used_bytes(self) -> int | None:
        if self._nvml is None:
            return None
        nvml = self._nvml
        try:
            return sum(int(nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self._handles)
        except Exception as exc:
            not_supported = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", None)
            if getattr(exc, "value", None) == not_supported:
                self.status = "not_supported"
            else:
                self.status = f"error: {exc}"
            self._nvml = None
            return None

    def utilization_pct(self) -> int | None:
        """Mean NVML GPU utilisation over the devices (percent of the last sample period a kernel ran)."""
        if self._nvml is None or not self._handles:
            return None
        try:
            rates = [int(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self._handles]
        except Exception:
            return None  # utilisation is optional in the curve; memory's status already says what NVML can do
        return round(sum(rates) / len(rates))


@dataclass(frozen=True)
class SlopeFit:
    gib_per_h: float
    """The slope of *available* memory: negative while memory is being eaten."""
    low_gib_per_h: float
    high_gib_per_h: float
    span_s: float
    points: int

    @property
    def leak_gib_per_h(self) -> float:
        """The leak rate, positive when available memory falls."""
        return -self.gib_per_h

    @property
    def leak_lower_bound_gib_per_h(self) -> float:
        """The smallest leak rate the 95% interval allows: flagging on it keeps noise from flagging."""
        return -self.high_gib_per_h


def fit_slope(times_s: Sequence[float], available_bytes: Sequence[int], min_span_s: float) -> SlopeFit | None:
    """Theil-Sen slope of available memory over the given window, in GiB/h; None with too little history."""
    if len(times_s) < 3:
        return None
    t = np.asarray(times_s, dtype=float)
    y = np.asarray(available_bytes, dtype=float) / GIB
    span = float(t[-1] - t[0])
    if span < min_span_s:
        return None
    if len(t) > MAX_FIT_POINTS:
        # Bucket medians keep the fit robust to spikes and its cost flat however fast we sample.
        edges = np.linspace(t[0], t[-1], MAX_FIT_POINTS + 1)
        idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, MAX_FIT_POINTS - 1)
        counts = np.bincount(idx, minlength=MAX_FIT_POINTS)
        keep = counts > 0
        order = np.argsort(idx, kind="stable")
        splits = np.cumsum(counts)[:-1]
        t_groups = np.split(t[order], splits)
        y_groups = np.split(y[order], splits)
        t = np.array([np.median(g) for g, k in zip(t_groups, keep, strict=True) if k])
        y = np.array([np.median(g) for g, k in zip(y_groups, keep, strict=True) if k])
    res = theilslopes(y, t, alpha=0.95)
    per_h = 3600.0
    return SlopeFit(
        gib_per_h=float(res.slope) * per_h,
        low_gib_per_h=float(res.low_slope) * per_h,
        high_gib_per_h=float(res.high_slope) * per_h,
        span_s=span,
        points=len(t),
    )
