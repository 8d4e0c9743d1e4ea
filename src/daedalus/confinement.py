"""The resources a confined step may use, and the kernel's means of holding it to them.

Every step that runs code from a worktree (the agent's commands, builds, gates) runs in a sandbox
(`daedalus.sandbox`) under `ResourceLimits`:

* processes and memory: a cgroup of its own per step (`StepCgroup`; cgroup v1's `pids` and `memory`
  controllers, or a delegated cgroup v2 directory given as `steps.cgroup_root`). Resource limits of the
  process (RLIMIT_NPROC) cannot do this: the sandbox's user namespace maps to the worker's user, and the
  kernel does not count a root worker's processes. Without a writable cgroup these two limits are not
  enforced, and every result of the step says so;
* temporary disk: the sandbox's `/tmp` is a tmpfs of `tmp_mib`;
* one file's size: RLIMIT_FSIZE (a write past it fails with EFBIG);
* wall time: the step's own timeout.

After the step, `StepCgroup.hits` names the limits it ran into (the kernel's counters, not a guess from its
output), and every process still in its cgroup is killed before the cgroup is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

from daedalus.schemas.steps import ResourceLimits

log = structlog.get_logger(__name__)

CGROUP_V1 = Path("/sys/fs/cgroup")
CGROUP_NAME = "daedalus"
MIB = 1024 * 1024


class StepSettings(BaseModel):
    """The `steps` section of daedalus.config.Settings (DAEDALUS_STEPS_*): how a host's builds and gates run."""

    model_config = ConfigDict(extra="forbid")

    read_only: list[Path] = Field(
        default_factory=list,
        description="host paths (absolute) every build and gate also sees read-only: models, datasets, tools",
    )
    limits: ResourceLimits = Field(
        default_factory=ResourceLimits, description="a step's limits where the host registry sets none"
    )
    cgroup_root: Path | None = Field(
        default=None,
        description="a delegated cgroup v2 directory steps get their cgroups in; None = cgroup v1 where writable",
    )

    @field_validator("read_only")
    @classmethod
    def _absolute(cls, paths: list[Path]) -> list[Path]:
        relative = [str(p) for p in paths if not p.is_absolute()]
        if relative:
            raise ValueError(f"steps.read_only paths must be absolute: {relative}")
        return paths


GPU_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def gpu_device_nodes(gpus: list[int], dev: Path = Path("/dev")) -> list[Path]:
    """The device nodes a step on leased GPUs `gpus` may open: those GPUs' own and the driver's control nodes,
    never another GPU's."""
    if not gpus:
        return []
    own = [dev / f"nvidia{index}" for index in gpus]
    return [node for node in (*own, *(dev / name for name in GPU_CONTROL_NODES)) if node.exists()]


def memory_limit_bytes(limits: ResourceLimits) -> int:
    """The memory limit in bytes: the given one, or `memory_fraction` of this host's memory."""
    if limits.memory_mib is not None:
        return limits.memory_mib * MIB
    return int(psutil.virtual_memory().total * limits.memory_fraction)


def set_rlimits(limits: ResourceLimits) -> None:
    """Run in the child before exec: the per-process limits (inherited by everything the step starts)."""
    size = limits.file_mib * MIB
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@dataclass(frozen=True)
class StepCgroup:
    """The cgroup directories of one step: one per controller (v1) or one for all of them (v2)."""

    pids: Path
    memory: Path
    unified: bool
    limits: ResourceLimits

    @classmethod
    def make(cls, limits: ResourceLimits, root: Path | None = None) -> StepCgroup | None:
        """A fresh cgroup for a step with its limits set; None when no writable cgroup is available."""
        name = f"step-{uuid.uuid4().hex[:12]}"
        try:
            if root is not None:
                made = cls(root / name, root / name, unified=True, limits=limits)
            elif _writable(CGROUP_V1 / "pids") and _writable(CGROUP_V1 / "memory"):
                made = cls(
                    CGROUP_V1 / "pids" / CGROUP_NAME / name,
                    CGROUP_V1 / "memory" / CGROUP_NAME / name,
                    unified=False,
                    limits=limits,
                )
            else:
                return None
            made._create()
        except OSError as error:
            log.warning("step_cgroup_unavailable", error=str(error))
            return None
        return made

    def _create(self) -> None:
        memory = str(memory_limit_bytes(self.limits))
        if self.unified:
            self.pids.mkdir(parents=False, exist_ok=False)
            (self.pids / "pids.max").write_text(str(self.limits.processes))
            (self.memory / "memory.max").write_text(memory)
            with contextlib.suppress(OSError):  # no swap accounting on this host
                (self.memory / "memory.swap.max").write_text("0")
            return
        for path in (self.pids, self.memory):
            path.mkdir(parents=True, exist_ok=False)
        (self.pids / "pids.max").write_text(str(self.limits.processes))
        (self.memory / "memory.limit_in_bytes").write_text(memory)
        with contextlib.suppress(OSError):  # no swap accounting on this host
            (self.memory / "memory.memsw.limit_in_bytes").write_text(memory)

    def enter(self) -> None:
        """Run in the child before exec: the step and everything it starts belong to this cgroup."""
        pid = str(os.getpid())
        for path in {self.pids, self.memory}:
            (path / "cgroup.procs").write_text(pid)

    def members(self) -> list[int]:
        pids: set[int] = set()
        for path in {self.pids, self.memory}:
            with contextlib.suppress(OSError):
                pids |= {int(line) for line in (path / "cgroup.procs").read_text().split()}
        return sorted(pids)

    def hits(self) -> list[str]:
        """The limits the step ran into, from the kernel's counters."""
        found = []
        events = _counters(self.pids / "pids.events")
        if events.get("max", 0) > 0:
            found.append(
                f"hit its process limit ({self.limits.processes} processes): {events['max']} fork(s) refused"
            )
        memory = (
            _counters(self.memory / "memory.events")
            if self.unified
            else _counters(self.memory / "memory.oom_control")
        )
        if memory.get("oom_kill", 0) > 0:
            limit = memory_limit_bytes(self.limits) / MIB
            found.append(
                f"hit its memory limit ({limit:.0f} MiB): the kernel killed {memory['oom_kill']} of its processes"
            )
        return found

    def remove(self) -> None:
        """Kill what is left in the cgroup (nothing should be: the sandbox's pid namespace ended), then remove it."""
        for _ in range(50):
            members = self.members()
            if not members:
                break
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        for path in {self.pids, self.memory}:
            with contextlib.suppress(OSError):
                path.rmdir()


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def _counters(path: Path) -> dict[str, int]:
    """A cgroup file of `name value` lines (pids.events, memory.events, memory.oom_control)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    counters = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            counters[name] = int(value)
    return counters


def unenforced(cgroup: StepCgroup | None) -> str | None:
    """What a step's result says when its processes and memory ran without limits."""
    if cgroup is not None:
        return None
    return (
        "processes and memory were not limited: this host has no writable cgroup for steps (cgroup v1 pids and "
        "memory, or steps.cgroup_root naming a delegated cgroup v2 directory)"
    )


@dataclass(frozen=True)
class Confinement:
    """One confined process tree's limits as its spawner applies them: `preexec` (in the child, before exec) sets
    the per-process limits and enters the tree's cgroup; `end` (once the tree is gone) says which limits it ran
    into and removes the cgroup. `record`/`recorded` keep the cgroup's place in a file, so whoever ends a tree it
    did not start (a retried activity following an agent) can still end it."""

    limits: ResourceLimits
    cgroup: StepCgroup | None

    @classmethod
    def start(cls, limits: ResourceLimits, root: Path | None = None) -> Confinement:
        return cls(limits, StepCgroup.make(limits, root))

    def preexec(self) -> None:
        set_rlimits(self.limits)
        if self.cgroup is not None:
            self.cgroup.enter()

    def end(self) -> tuple[list[str], str | None]:
        """(the limits the tree ran into, what was not enforced); the cgroup is removed."""
        hits = self.cgroup.hits() if self.cgroup is not None else []
        if self.cgroup is not None:
            self.cgroup.remove()
        return hits, unenforced(self.cgroup)

    def record(self, path: Path) -> None:
        cgroup = self.cgroup
        where = None if cgroup is None else {"pids": str(cgroup.pids), "memory": str(cgroup.memory),
                                             "unified": cgroup.unified}  # fmt: skip
        path.write_text(json.dumps({"limits": self.limits.model_dump(mode="json"), "cgroup": where}))

    @classmethod
    def recorded(cls, path: Path) -> Confinement | None:
        try:
            data = json.loads(path.read_text())
            limits = ResourceLimits.model_validate(data["limits"])
            where = data["cgroup"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        cgroup = (
            None
            if where is None
            else StepCgroup(Path(where["pids"]), Path(where["memory"]), bool(where["unified"]), limits)
        )
        return cls(limits, cgroup)


def limits_line(hits: list[str], unlimited: str | None) -> str:
    """What a step's result says of its limits: those it ran into, or that they were not enforced; '' if neither."""
    return "; ".join([*(f"the step {hit}" for hit in hits), *([unlimited] if unlimited else [])])
