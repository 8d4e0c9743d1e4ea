"""GPU measurements on a host without a GPU: the floor arithmetic, and clear refusals instead of numbers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from daedalus.engines.capacity import gpu_device, on_gpu
from daedalus.engines.gpu import (
    GpuUnavailable,
    NvmlDevice,
    copy_bandwidth,
    floor_fractions,
    floor_tps,
    model_bytes_per_token,
    nvml_or_none,
)
from daedalus.engines.measure import UnsupportedMetric, measure
from daedalus.engines.presets import load_preset
from daedalus.errors import EngineError
from daedalus.schemas.gates import METRIC_DIRECTIONS, Direction, Metric
from daedalus.training.memory import Nvml


def test_the_bandwidth_floor_is_bandwidth_over_bytes_per_token() -> None:
    # The anchor: 4.3 TB/s over a 1.78 GiB model is ~2,240 tok/s; 741 tok/s is ~0.33 of it.
    model_bytes = int(1.78 * 1024**3)
    assert floor_tps(4300.0, model_bytes) == pytest.approx(2249.8, rel=1e-3)
    assert floor_fractions([741.0, 886.0], 4300.0, model_bytes) == pytest.approx([0.3294, 0.3938], rel=1e-3)
    with pytest.raises(ValueError, match="positive"):
        floor_tps(0.0, model_bytes)
    assert METRIC_DIRECTIONS[Metric.FLOOR_FRACTION] is Direction.HIGHER_IS_BETTER


def test_bytes_per_token_is_the_model_file(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"\0" * 4096)
    assert model_bytes_per_token(model) == 4096
    with pytest.raises(EngineError, match="does not exist"):
        model_bytes_per_token(tmp_path / "missing.gguf")


def test_a_cpu_host_has_no_nvml_reading_and_says_so() -> None:
    with pytest.raises(GpuUnavailable, match="NVML"):
        NvmlDevice(0)
    assert nvml_or_none() is None
    watchdog_nvml = Nvml()  # the watchdog's reader: absent or an error, never a number
    assert watchdog_nvml.status != "ok" and watchdog_nvml.used_bytes() is None
    assert watchdog_nvml.utilization_pct() is None


def test_the_copy_benchmark_needs_cuda() -> None:
    with pytest.raises(GpuUnavailable, match=r"PyTorch with CUDA|CUDA GPU"):
        copy_bandwidth(buffer_gib=0.01, rounds=1)


def test_kib_per_token_of_a_gpu_preset_is_read_from_nvml_or_refused() -> None:
    gpu, cpu = load_preset("gpu-q8_0"), load_preset("local-q8_0")
    assert on_gpu(gpu) and not on_gpu(cpu)  # type: ignore[arg-type]
    assert gpu_device(cpu) is None  # type: ignore[arg-type]  # host RSS, as before
    with pytest.raises(EngineError, match="runs on the GPU, so KiB/token is read from NVML"):
        gpu_device(gpu)  # type: ignore[arg-type]


def test_floor_fraction_of_a_cpu_preset_is_refused_before_anything_starts(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"\0")
    with pytest.raises(UnsupportedMetric, match=r"floor_fraction is a GPU metric.*local-f16"):
        asyncio.run(measure(Metric.FLOOR_FRACTION, "local-f16", model, workdir=tmp_path))
    assert list(tmp_path.iterdir()) == [model]
