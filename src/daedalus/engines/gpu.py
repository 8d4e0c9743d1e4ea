"""GPU-side measurements: device memory from NVML, the device copy bandwidth, and the bandwidth floor.

Decode on a GPU is bound by memory bandwidth: every generated token reads every weight once, so a model of
B bytes cannot decode faster than (bandwidth / B) tok/s on one GPU. `floor_fraction` is the measured decode
tok/s divided by that bound, with the bandwidth *measured* on the same device (a device-to-device copy through
PyTorch, counting bytes read and written, the way the issue's anchor and the device notes count it) and B the
GGUF file's size (all weights, read once per token; the embedding table of these test models is a few KiB).
It is a fraction of a ceiling, not an efficiency claim: a copy kernel is not a GEMV.

Nothing here imports torch or pynvml at module import: a CPU host has neither, and says so clearly when asked.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daedalus.errors import EngineError, GpuUnavailable

GIB = 1024**3


@dataclass(frozen=True)
class GpuMemory:
    """One NVML reading of one device."""

    used_bytes: int
    total_bytes: int
    utilization_pct: int | None


class NvmlDevice:
    """NVML for one device index; raises GpuUnavailable with the reason where there is no NVML."""

    def __init__(self, index: int = 0) -> None:
        try:
            import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py: the `gpu` extra
        except ImportError:
            raise GpuUnavailable(
                "NVML is not importable here (pip install nvidia-ml-py, the `gpu` extra); on a CPU host "
                "GPU memory cannot be read: use the RSS-based KiB/token instead"
            ) from None
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.name = str(pynvml.nvmlDeviceGetName(self.handle))
        except Exception as exc:  # pynvml's NVMLError family: no driver, no such device
            raise GpuUnavailable(f"NVML found no GPU {index} here ({exc}); is this a GPU host?") from None
        self._nvml: Any = pynvml
        self.index = index

    def read(self) -> GpuMemory:
        nvml = self._nvml
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(self.handle)
        except Exception as exc:
            # Unified-memory hosts (GB10) answer NOT_SUPPORTED: there, host MemAvailable is the reading.
            raise GpuUnavailable(f"NVML cannot report memory of GPU {self.index} ({exc})") from None
        try:
            util: int | None = int(nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        except Exception:
            util = None
        return GpuMemory(used_bytes=int(info.used), total_bytes=int(info.total), utilization_pct=util)


def nvml_or_none(index: int = 0) -> NvmlDevice | None:
    """NVML for the device if there is one, else None (CPU hosts measure RSS instead)."""
    try:
        return NvmlDevice(index)
    except GpuUnavailable:
        return None


def settled_used_bytes(device: NvmlDevice, *, samples: int = 5, interval_s: float = 0.2) -> int:
    """The median of a few readings: allocations settle over a few hundred ms after a server is ready."""
    readings = []
    for _ in range(samples):
        readings.append(device.read().used_bytes)
        time.sleep(interval_s)
    return int(statistics.median(readings))


@dataclass(frozen=True)
class CopyBandwidth:
    """Device-to-device copy bandwidth: bytes read + written per second, over `rounds` timed copies."""

    gbs: float
    """The median round's GB/s (10^9 bytes), counting read and written bytes."""
    rounds_gbs: list[float]
    buffer_bytes: int
    device: str


def copy_bandwidth(buffer_gib: float = 2.0, rounds: int = 10, copies_per_round: int = 10) -> CopyBandwidth:
    """Time `copies_per_round` device-to-device copies of a `buffer_gib` tensor with CUDA events, per round."""
    try:
        import torch
    except ImportError:
        raise GpuUnavailable(
            "the copy benchmark needs PyTorch with CUDA; torch is not installed here"
        ) from None
    if not torch.cuda.is_available():
        raise GpuUnavailable("the copy benchmark needs a CUDA GPU; torch sees none on this host")
    n = int(buffer_gib * GIB)
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    for _ in range(3):  # warm-up: clocks up, allocator settled
        dst.copy_(src)
    torch.cuda.synchronize()
    results = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(copies_per_round):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000.0
        results.append(2 * n * copies_per_round / seconds / 1e9)
    name = torch.cuda.get_device_name(0)
    del src, dst
    torch.cuda.empty_cache()
    return CopyBandwidth(gbs=statistics.median(results), rounds_gbs=results, buffer_bytes=n, device=name)


def model_bytes_per_token(model: Path) -> int:
    """Bytes read per decoded token: the GGUF's size (every weight once; these models' embeddings are tiny)."""
    if not model.is_file():
        raise EngineError(f"model file {model} does not exist")
    return model.stat().st_size


def floor_tps(bandwidth_gbs: float, bytes_per_token: int) -> float:
    """The bandwidth floor: the fastest single-stream decode the measured bandwidth allows."""
    if bandwidth_gbs <= 0 or bytes_per_token <= 0:
        raise ValueError("bandwidth and bytes per token must be positive")
    return bandwidth_gbs * 1e9 / bytes_per_token


def floor_fractions(decode_tps: list[float], bandwidth_gbs: float, bytes_per_token: int) -> list[float]:
    """Each round's decode tok/s as a fraction of the bandwidth floor."""
    floor = floor_tps(bandwidth_gbs, bytes_per_token)
    return [tps / floor for tps in decode_tps]
