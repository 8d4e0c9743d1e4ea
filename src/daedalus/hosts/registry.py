"""The host registry: which hosts exist, their GPUs, queues, engine mirrors, tenants and standing constraints.

Read from `hosts.yaml` (path from `Settings.hosts_file`). The models are pure pydantic (safe inside workflows);
`load_registry` is the only I/O here.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from daedalus.errors import RegistryError
from daedalus.ids import host_queue
from daedalus.schemas._base import Model
from daedalus.schemas.steps import ResourceLimits
from daedalus.schemas.ticket import TICKET_ID_PATTERN, HostFacts

HOST_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"


class GpuSpec(Model):
    """A host's GPUs. `simulated` GPUs exist only in the registry (CPU hosts, tests): leases work the same,
    and their used memory is read from files under the host's state directory instead of NVML."""

    count: int = Field(ge=0, le=64)
    model: str = Field(default="unknown", min_length=1)
    memory_gib: float = Field(default=0.0, ge=0.0, description="per GPU; for unified memory, the shared pool")
    unified: bool = Field(default=False, description="CPU and GPU share one memory (GB10): NVML reports none")
    simulated: bool = False


class EngineMirror(Model):
    """An engine repository the host keeps a `git clone --mirror` of, and makes attempt worktrees from."""

    name: str = Field(min_length=1)
    url: str = Field(min_length=1, description="any URL git can fetch: ssh, https, git://, file://, a path")


class TenantSpec(Model):
    """Someone else's work on the host's GPUs (the ComfyUI render queue), time-shared on demand.

    Pausing it is process-level (the seed's lesson: ComfyUI's `/free` does not free what the DisTorch loader
    holds), and the GPUs count as free only when NVML says their used memory is below `free_below_mib`.
    """

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    gpus: list[int] = Field(min_length=1)
    priority: int = Field(default=50, ge=0, le=100)
    pause: str = Field(min_length=1, description="shell command that stops the tenant's GPU work")
    resume: str = Field(min_length=1, description="shell command that starts it again")
    free_below_mib: int = Field(default=1024, ge=0, description="per GPU, after pausing")
    free_timeout_s: float = Field(default=120.0, gt=0)
    command_timeout_s: float = Field(default=60.0, gt=0)


class ConstraintOp(StrEnum):
    LE = "<="
    LT = "<"
    GE = ">="
    GT = ">"
    EQ = "=="
    NE = "!="


_OPS: dict[ConstraintOp, Callable[[Any, Any], Any]] = {
    ConstraintOp.LE: operator.le,
    ConstraintOp.LT: operator.lt,
    ConstraintOp.GE: operator.ge,
    ConstraintOp.GT: operator.gt,
    ConstraintOp.EQ: operator.eq,
    ConstraintOp.NE: operator.ne,
}

# A constraint names a setting in the team's words; each engine spells it in its own preset field.
SETTING_FIELDS: dict[str, dict[str, str]] = {
    "max_model_len": {"vllm": "max_model_len", "llama.cpp": "context"},
    "tensor_parallel_size": {"vllm": "tensor_parallel_size"},
    "gpu_memory_utilization": {"vllm": "gpu_memory_utilization"},
    "kv_cache_dtype": {"vllm": "kv_cache_dtype", "llama.cpp": "cache_type_k"},
    "enable_prefix_caching": {"vllm": "enable_prefix_caching"},
    "parallel": {"llama.cpp": "parallel"},
}


class Constraint(Model):
    """A standing rule on presets launched on a host (or on every host: the pool), bound to a ticket.

    "max-model-len <= 16384 on the pool until ticket 5 passes" is
    `{setting: max_model_len, op: "<=", value: 16384, until_ticket: "5"}`.
    """

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    setting: str
    op: ConstraintOp
    value: int | float | str | bool
    until_ticket: str | None = Field(default=None, pattern=TICKET_ID_PATTERN)
    reason: str = ""

    @field_validator("setting")
    @classmethod
    def _known_setting(cls, setting: str) -> str:
        if setting not in SETTING_FIELDS:
            raise ValueError(f"unknown setting {setting!r}; known: {', '.join(sorted(SETTING_FIELDS))}")
        return setting

    def describe(self) -> str:
        until = f" until ticket {self.until_ticket} passes" if self.until_ticket else ""
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.id}: {self.setting} {self.op.value} {self.value}{until}{why}"

    def broken_by(self, engine: str, preset: dict[str, object]) -> str | None:
        """Why `preset` (a preset's fields, for `engine`) breaks this constraint, or None when it keeps it."""
        field = SETTING_FIELDS[self.setting].get(engine)
        if field is None or field not in preset or preset[field] is None:
            return None
        given = preset[field]
        try:
            holds = _OPS[self.op](given, self.value)
        except TypeError:
            return f"{field}={given!r} cannot be compared with {self.value!r} ({self.describe()})"
        return None if holds else f"{field}={given!r} breaks {self.describe()}"


class HostSpec(Model):
    name: str = Field(min_length=1, pattern=HOST_NAME_PATTERN)
    description: str = ""
    gpus: GpuSpec = Field(default_factory=lambda: GpuSpec(count=0))
    queue: str | None = Field(default=None, description="task queue its worker polls; default host-<name>")
    schedule_to_start_s: float = Field(
        default=900.0, gt=0, description="how long a step may wait for a worker before 'host unavailable'"
    )
    engines: list[EngineMirror] = Field(default_factory=list)
    tenants: list[TenantSpec] = Field(default_factory=list)
    constraints: list[Constraint] = Field(default_factory=list)
    limits: ResourceLimits | None = Field(
        default=None, description="what each confined step (agent command, build, gate) may use on this host"
    )

    @property
    def task_queue(self) -> str:
        return self.queue or host_queue(self.name)

    def facts(self) -> HostFacts:
        """What a ticket's workflow is told of this host when the ticket is filed."""
        return HostFacts(schedule_to_start_s=self.schedule_to_start_s, gpus=self.gpus.count)

    @model_validator(mode="after")
    def _consistent(self) -> HostSpec:
        for tenant in self.tenants:
            outside = sorted(set(tenant.gpus) - set(range(self.gpus.count)))
            if outside:
                raise ValueError(
                    f"tenant {tenant.name} names GPUs {outside}, but host {self.name} has "
                    f"{self.gpus.count} GPU(s) (indices 0..{self.gpus.count - 1})"
                )
        _unique("tenant", [t.name for t in self.tenants])
        _unique("engine", [e.name for e in self.engines])
        return self


class Registry(Model):
    hosts: list[HostSpec] = Field(min_length=1)
    constraints: list[Constraint] = Field(
        default_factory=list, description="pool constraints: they bind every host"
    )

    @model_validator(mode="after")
    def _unique_names(self) -> Registry:
        _unique("host", [h.name for h in self.hosts])
        _unique("constraint", [c.id for c in self.all_constraints()])
        return self

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def host(self, name: str) -> HostSpec:
        """The host called `name`; an unknown name is a RegistryError that lists the known ones."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise RegistryError(unknown_host_message(name, self.names))

    def all_constraints(self) -> list[Constraint]:
        return [*self.constraints, *(c for h in self.hosts for c in h.constraints)]

    def constraints_for(self, host: str) -> list[Constraint]:
        """The pool's constraints and the host's own."""
        return [*self.constraints, *self.host(host).constraints]


def _unique(what: str, names: list[str]) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{what} names must be unique; repeated: {repeated}")


def unknown_host_message(name: str, known: list[str]) -> str:
    return (
        f"unknown host {name!r}; hosts.yaml declares: {', '.join(known)} "
        f"(fix the ticket's `host:`, or add the host to hosts.yaml)"
    )


def parse_registry(data: object, source: str = "hosts.yaml") -> Registry:
    if not isinstance(data, dict):
        raise RegistryError(f"{source} must be a mapping with a `hosts:` list, not {type(data).__name__}")
    try:
        return Registry.model_validate(data)
    except ValidationError as error:
        lines = [f"{source} is not a valid host registry ({error.error_count()} problem(s)):"]
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"]) or "(top level)"
            lines.append(f"  - {where}: {problem['msg']}")
        raise RegistryError("\n".join(lines)) from error


def load_registry(path: Path) -> Registry:
    """Read and validate `hosts.yaml`; every problem names its field."""
    try:
        text = path.read_text()
    except OSError as error:
        raise RegistryError(
            f"cannot read the host registry {path}: {error.strerror}; set DAEDALUS_HOSTS_FILE "
            f"to your hosts.yaml (examples/hosts.yaml is the demo's)"
        ) from error
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise RegistryError(f"{path} is not valid YAML: {error}") from error
    return parse_registry(data, str(path))
