"""The GPU readers of `daedalus host check`, against what nvidia-smi and NVML said on the lent H200
(tests/fixtures/gpu/, recorded by `bench/gpu.py stage`: `nvidia-smi -q -x`, its compute-capability query, and
every NVML call the reader made with the real library's answer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daedalus.config import Settings
from daedalus.hosts.check import CheckContext, GpuReadings, judge_gpus
from daedalus.hosts.gpu_probe import (
    GpuReadError,
    ReplayNvml,
    disagreements,
    parse_compute_caps,
    parse_nvidia_smi_xml,
    read_nvml,
)
from daedalus.hosts.registry import GpuSpec, HostSpec
from daedalus.schemas.host_check import CheckStatus

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpu"
SMI = FIXTURES / "h200-nvidia-smi.xml"
CAPS = FIXTURES / "h200-nvidia-smi-compute-cap.csv"
NVML = FIXTURES / "h200-nvml.json"
UUID = "GPU-329e542b-7318-25c9-99f6-8e457f0a8752"


def ctx(gpus: int) -> CheckContext:
    spec = HostSpec(name="h200", gpus=GpuSpec(count=gpus, model="NVIDIA H200", memory_gib=140))
    return CheckContext(Settings.load(env_file=None), "h200", spec)


def edited_nvml(tmp_path: Path, call: str, value: object) -> ReplayNvml:
    """The H200 recording with one answer changed, as another host's driver might give it."""
    recording = json.loads(NVML.read_text())
    for entry in recording["calls"]:
        if entry["call"] == call:
            entry["value"] = value
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(recording))
    return ReplayNvml(path)


def test_nvidia_smi_xml_of_the_h200() -> None:
    report = parse_nvidia_smi_xml(SMI.read_text())
    assert report.driver == "580.159.04"
    [gpu] = report.gpus
    assert (gpu.index, gpu.uuid, gpu.name, gpu.minor_number) == (0, UUID, "NVIDIA H200", 0)
    assert (gpu.memory_total_mib, gpu.memory_free_mib, gpu.processes) == (143771, 143156, 0)
    assert parse_compute_caps(CAPS.read_text()) == {UUID: "9.0"}


def test_nvml_of_the_h200_agrees_with_nvidia_smi() -> None:
    nvml = read_nvml(ReplayNvml(NVML))
    [gpu] = nvml.gpus
    assert (gpu.uuid, gpu.name, gpu.minor_number, gpu.compute_capability) == (UUID, "NVIDIA H200", 0, "9.0")
    assert (gpu.memory_total_mib, gpu.processes) == (143771, 0)
    assert nvml.driver == "580.159.04"
    assert disagreements(parse_nvidia_smi_xml(SMI.read_text()), nvml) == []


def test_the_h200_as_declared_passes_and_miscounted_fails_naming_the_count() -> None:
    readings = GpuReadings(parse_nvidia_smi_xml(SMI.read_text()), read_nvml(ReplayNvml(NVML)), {})
    lines = {line.name: line for line in judge_gpus(ctx(1), readings)}
    assert {n: line.status for n, line in lines.items()} == {
        "gpus": CheckStatus.OK, "compute-capability": CheckStatus.OK, "gpu-memory": CheckStatus.OK,
    }  # fmt: skip
    assert "1x NVIDIA H200, driver 580.159.04" in lines["gpus"].detail
    assert "GPU 0: 143,155 of 143,771 MiB free" in lines["gpu-memory"].detail
    wrong = {line.name: line for line in judge_gpus(ctx(2), readings)}["gpus"]
    assert wrong.status is CheckStatus.FAIL and "set gpus.count: 1" in wrong.fix


def test_nvidia_smi_and_nvml_that_disagree_fail(tmp_path: Path) -> None:
    other = read_nvml(edited_nvml(tmp_path, "nvmlDeviceGetUUID", "GPU-00000000-0000-0000-0000-000000000000"))
    readings = GpuReadings(parse_nvidia_smi_xml(SMI.read_text()), other, {})
    line = judge_gpus(ctx(1), readings)[0]
    assert line.status is CheckStatus.FAIL
    assert f"GPU 0 is {UUID} in nvidia-smi, GPU-00000000" in line.detail and "driver" in line.fix


def test_a_gpu_whose_device_node_is_not_its_index_fails(tmp_path: Path) -> None:
    renumbered = read_nvml(edited_nvml(tmp_path, "nvmlDeviceGetMinorNumber", 3))
    readings = GpuReadings(parse_nvidia_smi_xml(SMI.read_text()), renumbered, {})
    lines = {line.name: line for line in judge_gpus(ctx(1), readings)}
    assert (
        lines["device-nodes"].status is CheckStatus.FAIL
        and "GPU 0 is /dev/nvidia3" in lines["device-nodes"].detail
    )


def test_a_gpu_mostly_held_by_someone_else_is_a_warning(tmp_path: Path) -> None:
    busy = read_nvml(edited_nvml(tmp_path, "nvmlDeviceGetMemoryInfo",
                                 {"total": 150754820096, "free": 10 * 2**30, "used": 140 * 2**30}))  # fmt: skip
    readings = GpuReadings(parse_nvidia_smi_xml(SMI.read_text()), busy, {})
    line = {line.name: line for line in judge_gpus(ctx(1), readings)}["gpu-memory"]
    assert line.status is CheckStatus.WARN and "more than half used by others" in line.detail


def test_unreadable_gpus_on_a_host_declared_with_them_fail() -> None:
    readings = GpuReadings(None, None, {}, problem="nvidia-smi is not on PATH")
    [line] = judge_gpus(ctx(1), readings)
    assert line.status is CheckStatus.FAIL and "nvidia-smi is not on PATH" in line.detail and line.fix


def test_unified_memory_and_broken_output() -> None:
    unified = SMI.read_text().replace("<total>143771 MiB</total>", "<total>[N/A]</total>", 1)
    assert parse_nvidia_smi_xml(unified).gpus[0].memory_total_mib is None
    with pytest.raises(GpuReadError, match="did not print XML"):
        parse_nvidia_smi_xml("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    with pytest.raises(GpuReadError, match="compute_cap printed"):
        parse_compute_caps("0, GPU-1, [N/A]\n")
