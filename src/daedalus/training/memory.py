"""Memory readings for the training watchdog, and the robust leak slope fitted to them.

Production reads host-wide MemAvailable: on unified-memory hosts (GB10) GPU allocations are invisible to
cgroups and to RSS, but they do lower MemAvailable. Tests read `budget - RSS of the trainer's process tree`
so that a trainer allocating a few hundred MiB trips the stop without pushing a shared machine near OOM. A run
given a memory limit of its own (`memory_limit_mib`) runs in a memory cgroup (`TrainerCgroup`), whose usage the
kernel counts and, past the limit, OOM-kills inside: nothing else on the host is touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import psutil
from scipy.stats import theilslopes

from daedalus.confinement import CGROUP_NAME, CGROUP_V1
from daedalus.errors import TrainingInputError
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


@dataclass(frozen=True)
class TrainerCgroup:
    """The trainer's own memory cgroup: cgroup v1's memory controller, or a directory of a delegated cgroup v2
    tree (`steps.cgroup_root`). The keeper moves the trainer into it before it executes, so everything the
    trainer starts is in it too; the keeper itself stays outside, so it outlives an OOM kill and records it."""

    path: Path
    unified: bool
    limit_bytes: int

    RECORD = "cgroup.json"

    @classmethod
    def make(cls, label: str, limit_bytes: int, root: Path | None = None) -> TrainerCgroup:
        """A fresh cgroup with the limit set, or TrainingInputError saying why none can be made here."""
        name = f"train-{label}-{uuid.uuid4().hex[:8]}"
        if root is not None:
            made = cls(root / name, unified=True, limit_bytes=limit_bytes)
        elif _writable(CGROUP_V1 / "memory"):
            made = cls(CGROUP_V1 / "memory" / CGROUP_NAME / name, unified=False, limit_bytes=limit_bytes)
        else:
            raise TrainingInputError(
                "memory_limit_mib needs a memory cgroup the worker can create: cgroup v1's memory controller "
                f"({CGROUP_V1 / 'memory'}, writable by root) or a delegated cgroup v2 directory (steps.cgroup_root)"
            )
        try:
            made.path.mkdir(parents=not made.unified, exist_ok=False)
            if made.unified:
                (made.path / "memory.max").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):  # no swap accounting on this host
                    (made.path / "memory.swap.max").write_text("0")
            else:
                (made.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):  # no swap accounting on this host
                    (made.path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        except OSError as error:
            with contextlib.suppress(OSError):
                made.path.rmdir()
            raise TrainingInputError(
                f"could not make the trainer's memory cgroup {made.path}: {error.strerror or error}"
            ) from error
        return made

    def save(self, run_dir: Path) -> None:
        record = {"path": str(self.path), "unified": self.unified, "limit_bytes": self.limit_bytes}
        tmp = run_dir / f".{self.RECORD}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, run_dir / self.RECORD)

    @classmethod
    def load(cls, run_dir: Path) -> TrainerCgroup | None:
        try:
            data = json.loads((run_dir / cls.RECORD).read_text())
            return cls(Path(data["path"]), bool(data["unified"]), int(data["limit_bytes"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def procs(self) -> Path:
        """The file the keeper writes the trainer's pid to."""
        return self.path / "cgroup.procs"

    @property
    def usage_file(self) -> Path:
        return self.path / ("memory.current" if self.unified else "memory.usage_in_bytes")

    @property
    def oom_file(self) -> Path:
        """Where the kernel counts the OOM kills in this cgroup (`oom_kill N`)."""
        return self.path / ("memory.events" if self.unified else "memory.oom_control")

    def usage_bytes(self) -> int:
        try:
            return int(self.usage_file.read_text())
        except (OSError, ValueError):
            return 0  # removed: nothing of it uses memory any more

    def peak_bytes(self) -> int | None:
        try:
            return int(
                (self.path / ("memory.peak" if self.unified else "memory.max_usage_in_bytes")).read_text()
            )
        except (OSError, ValueError):
            return None

    def members(self) -> list[int]:
        try:
            return [int(line) for line in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def remove(self) -> None:
        """Kill whatever is still in it (nothing, once the trainer's group is gone), then remove it."""
        for _ in range(50):
            members = self.members()
            if not members:
                break
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


class CgroupMemory:
    """The trainer cgroup's limit minus its usage: what is left before the kernel OOM-kills inside it."""

    def __init__(self, cgroup: TrainerCgroup):
        self.cgroup = cgroup

    def available_bytes(self) -> int:
        return self.cgroup.limit_bytes - self.cgroup.usage_bytes()


def reader_for(policy: WatchdogPolicy, trainer_pid: int, cgroup: TrainerCgroup | None = None) -> MemoryReader:
    if policy.memory_source is MemorySource.PROCESS_TREE:
        assert policy.budget_mib is not None  # the schema enforces it
        return ProcessTreeMemory(trainer_pid, policy.budget_mib * MIB)
    if policy.memory_source is MemorySource.CGROUP:
        if cgroup is None:
            raise TrainingInputError(
                "memory_source 'cgroup' reads the trainer's own memory cgroup, and this incarnation has none "
                "(it was started without memory_limit_mib)"
            )
        return CgroupMemory(cgroup)
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
        order = np.argsort(idx, kind="stable")
        ends = np.cumsum(counts)[counts > 0].tolist()
        t_sorted, y_sorted = t[order].tolist(), y[order].tolist()
        # statistics.median on each bucket's few values: np.median's per-call overhead was most of a fit's cost
        # (90 buckets x 2 calls, ~18 ms a fit on the 2-core machine, against ~3 ms now).
        starts = [0, *ends[:-1]]
        t = np.array([statistics.median(t_sorted[a:b]) for a, b in zip(starts, ends, strict=True)])
        y = np.array([statistics.median(y_sorted[a:b]) for a, b in zip(starts, ends, strict=True)])
    res = theilslopes(y, t, alpha=0.95)
    per_h = 3600.0
    return SlopeFit(
        gib_per_h=float(res.slope) * per_h,
        low_gib_per_h=float(res.low_slope) * per_h,
        high_gib_per_h=float(res.high_slope) * per_h,
        span_s=span,
        points=len(t),
    )
