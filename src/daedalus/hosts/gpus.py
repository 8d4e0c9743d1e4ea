"""How much memory each GPU of this host uses: NVML on a real host, files on a host whose GPUs are simulated.

A tenant's GPUs count as free only by this reading, never by the tenant's own word (the seed's lesson: the
render queue's `/free` endpoint does not free what the DisTorch loader holds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

GPU_STATE_ENV = "DAEDALUS_GPU_STATE_DIR"
"""Given to tenant commands on a simulated host: where simulated GPU `i` keeps its used memory (`gpu<i>.used_mib`)."""


class GpuMemory(Protocol):
    def used_mib(self, gpus: list[int]) -> dict[int, int | None]:
        """Used MiB per GPU index; None where the device cannot say (unified memory, NVML error)."""
        ...


class NvmlGpuMemory:
    def __init__(self) -> None:
        self.problem: str | None = None
        self._nvml: Any = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as error:  # ImportError, or pynvml's NVMLError family: no reading at all
            self.problem = f"NVML unavailable ({error}); install nvidia-ml-py on GPU hosts"

    def used_mib(self, gpus: list[int]) -> dict[int, int | None]:
        readings: dict[int, int | None] = {}
        for index in gpus:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                readings[index] = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used) // (1024 * 1024)
            except Exception as error:  # NOT_SUPPORTED on unified memory, or no NVML
                self.problem = f"GPU {index}: {error}"
                readings[index] = None
        return readings


class SimulatedGpuMemory:
    """GPUs that exist only in the registry: a simulated tenant writes what it "uses" to `gpu<i>.used_mib`."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.problem: str | None = None

    def path(self, index: int) -> Path:
        return self.state_dir / f"gpu{index}.used_mib"

    def used_mib(self, gpus: list[int]) -> dict[int, int | None]:
        readings: dict[int, int | None] = {}
        for index in gpus:
            try:
                readings[index] = int(self.path(index).read_text().strip() or 0)
            except FileNotFoundError:
                readings[index] = 0
            except ValueError:
                readings[index] = None
        return readings


def set_simulated_used(state_dir: Path, index: int, mib: int) -> None:
    """What a simulated tenant calls to say it holds `mib` on GPU `index` (0 removes the claim)."""
    path = SimulatedGpuMemory(state_dir).path(index)
    if mib <= 0:
        path.unlink(missing_ok=True)
        return
    state_dir.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(str(mib))
    temporary.replace(path)
