"""The decode workspace as a measured figure (seed ticket 5): the memory one user's long-context request makes the
server hold beyond its idle footprint.

The seed's wall: one user's 32K+ decode OOM-killed the TP4 server, because the TQ decode workspace grew with the
context (+15 GB per card at 55K) while the KV pool itself was far from full. So the figure is not the KV pool
(vLLM reports that, `kv_pool_tokens`) but what the server's processes add while serving one long request: the
highest resident memory of the server's process tree during the request, minus the tree's memory when it had
served nothing yet, per round. It takes in whatever the engine allocates to serve the request: attention and
sampler workspaces, allocator growth, and the pages of the preallocated KV pool the request is the first to touch
(on the CPU build; on a GPU host the same reading would come from NVML, not RSS). The allocator keeps what it
allocated, so after the warm-up the rounds read the request's high-water mark, each against the same idle base.

The request's prompt is sized in words; the tokens it was, the KV pool the server reported (start-up log and
/metrics) and its max_model_len are kept beside the samples: a prompt that did not fit is refused by the server,
and the measurement is then INVALID with the server's reason.
"""

from __future__ import annotations

import asyncio
import threading
import time

import psutil
from pydantic import Field

from daedalus.engines.base import Server
from daedalus.engines.bench import make_prompt
from daedalus.schemas._base import Model
from daedalus.schemas.engines import Workload

SAMPLE_EVERY_S = 0.02
MIB = 1024 * 1024


class WorkspaceResult(Model):
    """Per measured round, the server tree's peak RSS during the request minus its idle RSS before any request."""

    preset: str
    samples_mib: list[float]
    idle_mib: float
    peaks_mib: list[float] = Field(default_factory=list, description="every round's peak, warm-ups included")
    prompt_tokens: list[int] = Field(default_factory=list)
    refused: str | None = Field(default=None, description="the server's reason, when it refused the prompt")


def tree_rss(root: psutil.Process) -> int:
    """Resident bytes of a process and all its descendants (vanished ones count for nothing)."""
    total = 0
    for process in (root, *root.children(recursive=True)):
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


class _Peak:
    """The highest tree RSS seen by a sampling thread, from `start` until `stop`."""

    def __init__(self, root: psutil.Process) -> None:
        self.root = root
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, tree_rss(self.root))
            time.sleep(SAMPLE_EVERY_S)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss(self.root))


async def decode_workspace(
    server: Server, workload: Workload, *, idle_rss: int | None = None
) -> WorkspaceResult:
    """One user, one long request a round (fresh prompt each round: no prefix-cache hit), the tree's peak read
    every 20 ms. The idle base is `idle_rss`, read when the server had served nothing yet; by default it is read
    now, so call it on a fresh server."""
    root = psutil.Process(server.process.pid)
    idle = tree_rss(root) if idle_rss is None else idle_rss
    endpoint = server.endpoint(workload.request_timeout_s)
    samples: list[float] = []
    peaks: list[float] = []
    tokens: list[int] = []
    refused: str | None = None
    for number in range(workload.warmup_rounds + workload.rounds):
        prompt = make_prompt(
            workload.prompt_words, seed=workload.seed, round_no=number, user=0, side="workspace"
        )
        with _Peak(root) as peak:
            sample = await endpoint.stream_completion(
                prompt, max_tokens=workload.max_tokens, seed=number, user=0
            )
        if not sample.ok:
            refused = sample.error
            break
        peaks.append(peak.peak / MIB)
        if number >= workload.warmup_rounds:
            samples.append((peak.peak - idle) / MIB)
        counted = await asyncio.to_thread(endpoint.prompt_tokens_blocking, prompt)
        tokens.append(counted if counted is not None else -1)
    return WorkspaceResult(preset=server.adapter.preset.name, samples_mib=samples, idle_mib=idle / MIB,
                           peaks_mib=peaks, prompt_tokens=tokens, refused=refused)  # fmt: skip
