"""What a host's GPUs are, read two ways: `nvidia-smi -q -x` (the driver's tool) and NVML (the library the
gates and the watchdog read memory from). `daedalus host check` compares the two; the tests read recordings
of both made on the lent H200 (tests/fixtures/gpu/).

NVML is reached through an object with pynvml's functions: the real module on a host, or `ReplayNvml` over a
recording that `RecordingNvml` made of the real module's answers.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuReading:
    """One GPU as one reader saw it. Memory in MiB; None where the device does not say (unified memory)."""

    index: int
    uuid: str
    name: str
    minor_number: int | None
    """The N of its /dev/nvidiaN."""
    memory_total_mib: int | None
    memory_free_mib: int | None
    compute_capability: str | None = None
    """"9.0"; nvidia-smi's XML does not carry it (its CSV query does)."""
    processes: int | None = None


@dataclass(frozen=True)
class GpuReport:
    source: str
    driver: str
    gpus: list[GpuReading] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class GpuReadError(Exception):
    """A reader's input is not what the driver's tools print (the message says what was expected)."""


_MIB_VALUE = re.compile(r"^\s*(\d+)\s*MiB\s*$")


def _mib(node: ET.Element | None) -> int | None:
    if node is None or node.text is None:
        return None
    found = _MIB_VALUE.match(node.text)
    return int(found.group(1)) if found else None  # "[N/A]" on unified-memory devices


def _text(node: ET.Element, path: str) -> str:
    found = node.find(path)
    return (found.text or "").strip() if found is not None else ""


def parse_nvidia_smi_xml(text: str) -> GpuReport:
    """`nvidia-smi -q -x`: one <gpu> element per device, in NVML's index order."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as error:
        raise GpuReadError(f"nvidia-smi -q -x did not print XML ({error})") from None
    if root.tag != "nvidia_smi_log":
        raise GpuReadError(f"nvidia-smi -q -x printed <{root.tag}>, not <nvidia_smi_log>")
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        minor = _text(gpu, "minor_number")
        processes = gpu.find("processes")
        gpus.append(
            GpuReading(
                index=index,
                uuid=_text(gpu, "uuid"),
                name=_text(gpu, "product_name"),
                minor_number=int(minor) if minor.isdigit() else None,
                memory_total_mib=_mib(gpu.find("fb_memory_usage/total")),
                memory_free_mib=_mib(gpu.find("fb_memory_usage/free")),
                processes=len(processes.findall("process_info")) if processes is not None else None,
            )
        )
    return GpuReport(source="nvidia-smi", driver=_text(root, "driver_version"), gpus=gpus)


COMPUTE_CAP_QUERY = ("--query-gpu=index,uuid,compute_cap", "--format=csv,noheader")


def parse_compute_caps(text: str) -> dict[str, str]:
    """`nvidia-smi --query-gpu=index,uuid,compute_cap --format=csv,noheader` -> uuid: "9.0"."""
    caps = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not re.fullmatch(r"\d+\.\d+", parts[2]):
            raise GpuReadError(f"nvidia-smi --query-gpu=index,uuid,compute_cap printed {line!r}")
        caps[parts[1]] = parts[2]
    return caps


class NvmlApi(Protocol):
    """The part of pynvml (nvidia-ml-py) the readers call."""

    def nvmlInit(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...


def _str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:  # pynvml's NVMLError family: NOT_SUPPORTED (unified memory), NO_PERMISSION ...
        return None


def read_nvml(nvml: NvmlApi) -> GpuReport:
    """Every device NVML enumerates, in its index order (the order CUDA_VISIBLE_DEVICES and leases use)."""
    nvml.nvmlInit()
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = _optional(partial(nvml.nvmlDeviceGetMemoryInfo, handle))
        capability = _optional(partial(nvml.nvmlDeviceGetCudaComputeCapability, handle))
        processes = _optional(partial(nvml.nvmlDeviceGetComputeRunningProcesses, handle))
        gpus.append(
            GpuReading(
                index=index,
                uuid=_str(nvml.nvmlDeviceGetUUID(handle)),
                name=_str(nvml.nvmlDeviceGetName(handle)),
                minor_number=_optional(partial(nvml.nvmlDeviceGetMinorNumber, handle)),
                memory_total_mib=int(memory.total) // MIB if memory is not None else None,
                memory_free_mib=int(memory.free) // MIB if memory is not None else None,
                compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
                processes=len(processes) if processes is not None else None,
            )
        )
    return GpuReport(source="NVML", driver=_str(nvml.nvmlSystemGetDriverVersion()), gpus=gpus)


def disagreements(smi: GpuReport, nvml: GpuReport) -> list[str]:
    """Where nvidia-smi and NVML disagree on what the GPUs are (count, order, identity, memory size, driver)."""
    problems = []
    if smi.driver != nvml.driver:
        problems.append(f"driver {smi.driver} (nvidia-smi) vs {nvml.driver} (NVML)")
    if len(smi.gpus) != len(nvml.gpus):
        problems.append(f"{len(smi.gpus)} GPU(s) in nvidia-smi, {len(nvml.gpus)} in NVML")
    for a, b in zip(smi.gpus, nvml.gpus, strict=False):
        if a.uuid != b.uuid:
            problems.append(f"GPU {a.index} is {a.uuid} in nvidia-smi, {b.uuid} in NVML")
        if a.name != b.name:
            problems.append(f"GPU {a.index} is {a.name!r} in nvidia-smi, {b.name!r} in NVML")
        if a.memory_total_mib != b.memory_total_mib:
            problems.append(
                f"GPU {a.index} has {a.memory_total_mib} MiB in nvidia-smi, {b.memory_total_mib} MiB in NVML"
            )
    return problems


# --- recordings ---------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A pynvml answer as JSON: ctypes structures as their fields, bytes as text."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields is not None:
        return {name: _plain(getattr(value, name)) for name, *_ in fields}
    return repr(value)


class RecordingNvml:
    """pynvml, with every answer written down (handles as the index they came from), for `ReplayNvml`."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles: dict[int, int] = {}
        self.calls: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        real = getattr(self._nvml, name)

        def call(*args: Any) -> Any:
            shown = [self._handles.get(id(a), a) if not isinstance(a, int) else a for a in args]
            try:
                value = real(*args)
            except Exception as error:
                self.calls.append({"call": name, "args": shown, "error": f"{type(error).__name__}: {error}"})
                raise
            if name == "nvmlDeviceGetHandleByIndex":
                self._handles[id(value)] = args[0]
                self.calls.append({"call": name, "args": shown, "value": {"handle": args[0]}})
            else:
                self.calls.append({"call": name, "args": shown, "value": _plain(value)})
            return value

        return call

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"calls": self.calls}, indent=1) + "\n")


class _Struct:
    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)


class ReplayNvml:
    """Answers each pynvml call as the recording says the real library answered it (an error it raised is
    raised again, as an exception carrying its text)."""

    def __init__(self, path: Path) -> None:
        self._answers: dict[tuple[str, str], dict[str, Any]] = {}
        for call in json.loads(path.read_text())["calls"]:
            self._answers[(call["call"], json.dumps(call["args"]))] = call

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            shown = [
                a["handle"] if isinstance(a, dict) else a for a in (getattr(x, "__dict__", x) for x in args)
            ]
            answer = self._answers.get((name, json.dumps(shown)))
            if answer is None:
                raise LookupError(f"the recording has no answer to {name}{tuple(shown)}")
            if "error" in answer:
                raise RuntimeError(answer["error"])
            value = answer["value"]
            if isinstance(value, dict):
                return _Struct(value)
            if isinstance(value, list) and name == "nvmlDeviceGetCudaComputeCapability":
                return tuple(value)
            return value

        return call
