"""Engine presets, benchmark workloads, and what benchmarks, capacity runs and quality probes produce."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from daedalus.schemas._base import Model

# Stock llama.cpp cache types, plus the turbo fork's (a stock build rejects those at launch with a clear error).
LLAMA_CACHE_TYPES = (
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "q4_1",
    "iq4_nl",
    "q5_0",
    "q5_1",
    "turbo2",
    "turbo3",
    "turbo4",
)
# vLLM's kv-cache dtypes, plus the 1cat fork's TurboQuant family (the seed's matrix).
VLLM_KV_DTYPES = (
    "auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2",
    "tq_4bit_nc", "tq_3bit_nc", "tq_k3v4_nc", "tq_k8v4",
)  # fmt: skip


class EngineKind(StrEnum):
    LLAMA_CPP = "llama.cpp"
    VLLM = "vllm"


class DraftSpec(Model):
    """llama.cpp speculative decoding with a draft model; `self` drafts with the target model itself."""

    model: Literal["self"] | Path = "self"
    draft_max: int = Field(default=8, ge=1, le=64)
    draft_min: int = Field(default=0, ge=0)
    p_min: float = Field(default=0.0, ge=0.0, le=1.0)


class LlamaCppPreset(Model):
    """A llama-server launch: context, slots, KV cache types, speculative settings, extra env."""

    engine: Literal["llama.cpp"]
    name: str = Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    context: int = Field(default=4096, ge=64, description="total context (-c), shared by all slots")
    parallel: int = Field(default=1, ge=1, le=256, description="server slots (-np)")
    threads: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1)
    ubatch_size: int | None = Field(default=None, ge=1)
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: Literal["on", "off", "auto"] = "auto"
    n_gpu_layers: int = Field(default=0, ge=0)
    backend: Literal["cpu", "cuda"] = Field(
        default="cpu", description="which llama.cpp build serves it: the CPU build, or the CUDA build"
    )
    cuda_architectures: list[str] = Field(
        default_factory=list, description="CMake CUDA architectures (90 for H100/H200); empty: ask nvidia-smi"
    )
    draft: DraftSpec | None = None
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("cache_type_k", "cache_type_v")
    @classmethod
    def _known_cache_type(cls, value: str) -> str:
        if value not in LLAMA_CACHE_TYPES:
            raise ValueError(f"unknown KV cache type {value!r}; known: {', '.join(LLAMA_CACHE_TYPES)}")
        return value

    @model_validator(mode="after")
    def _quantized_v_needs_flash_attn(self) -> LlamaCppPreset:
        # llama.cpp refuses a quantized V cache without flash attention; say so before launching anything.
        if self.cache_type_v not in ("f16", "f32", "bf16") and self.flash_attn == "off":
            raise ValueError(f"cache_type_v {self.cache_type_v!r} needs flash_attn 'on' or 'auto', not 'off'")
        if self.backend == "cpu" and self.cuda_architectures:
            raise ValueError("cuda_architectures is set but backend is 'cpu'; set backend: cuda or drop it")
        if self.backend == "cuda" and self.n_gpu_layers == 0:
            raise ValueError(
                "backend 'cuda' with n_gpu_layers 0 would run on the CPU; set n_gpu_layers (e.g. 999)"
            )
        return self


class SpeculativeConfig(Model):
    """vLLM `--speculative-config`: MTP (or another method) proposing `num_speculative_tokens` (k)."""

    method: Literal["mtp", "ngram", "eagle", "eagle3", "draft_model"] = "mtp"
    num_speculative_tokens: int = Field(ge=1, le=16)
    model: str | None = None


class VllmPreset(Model):
    """A `vllm serve` launch on a GPU host."""

    engine: Literal["vllm"]
    name: str = Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    max_model_len: int = Field(ge=64)
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    kv_cache_dtype: str = "auto"
    max_num_seqs: int | None = Field(default=None, ge=1)
    enable_prefix_caching: bool = Field(
        default=False, description="off by default: the seed found prefix-cache hits take a broken path"
    )
    enforce_eager: bool = False
    speculative: SpeculativeConfig | None = None
    additional_config: dict[str, int | float | str | bool] = Field(
        default_factory=dict, description="fork knobs passed as --additional-config JSON (e.g. TQ splits)"
    )
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("kv_cache_dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in VLLM_KV_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {value!r}; known: {', '.join(VLLM_KV_DTYPES)}")
        return value


Preset = Annotated[LlamaCppPreset | VllmPreset, Field(discriminator="engine")]


class Workload(Model):
    """One benchmark shape: concurrent users, prompt and completion lengths, rounds."""

    users: list[int] = Field(default_factory=lambda: [1], min_length=1)
    prompt_words: int = Field(default=32, ge=1, le=100_000)
    max_tokens: int = Field(default=64, ge=2, le=100_000)
    rounds: int = Field(default=7, ge=1, le=100)
    warmup_rounds: int = Field(default=1, ge=0, le=10)
    seed: int = 0
    request_timeout_s: float = Field(default=120.0, gt=0)

    @field_validator("users")
    @classmethod
    def _positive_users(cls, value: list[int]) -> list[int]:
        if any(u < 1 for u in value):
            raise ValueError(f"users must all be >= 1; got {value}")
        return value


class RequestSample(Model):
    """One streamed request, client-side and (where the server reports them) server-side timings."""

    user: int
    ok: bool
    error: str | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    completion_tokens: int = 0
    content_chunks: int = 0
    client_decode_tps: float | None = None
    server_decode_tps: float | None = None
    server_prompt_ms: float | None = None
    server_prompt_tps: float | None = None
    server_predicted_n: int | None = None
    text: str = ""


class RoundResult(Model):
    round: int
    users: int
    preset: str
    warmup: bool
    wall_s: float
    requests: list[RequestSample]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.requests)


class Summary(Model):
    n: int
    median: float
    ci_low: float
    ci_high: float
    cv: float


class ConcurrencyResult(Model):
    """Per measured round, the median over its requests (decode tok/s per user, TTFT, TPOT)."""

    users: int
    preset: str
    decode_tps: list[float]
    client_decode_tps: list[float]
    ttft_ms: list[float]
    tpot_ms: list[float]
    aggregate_tps: list[float]
    decode_summary: Summary | None = None
    server_client_disagreement: float | None = Field(
        default=None, description="median |client/server - 1| of decode tok/s; > 0.03 is flagged"
    )
    timing_source: Literal["server", "client"] = "client"


class BenchResult(Model):
    """A whole benchmark run: every round kept, validity decided before any number is read."""

    run_id: str
    preset: str
    baseline_preset: str | None = None
    model: str
    workload: Workload
    results: list[ConcurrencyResult]
    baseline_results: list[ConcurrencyResult] = Field(default_factory=list)
    failed_requests: int = 0
    token_count_mismatches: int = 0
    preemptions: int = 0
    prefix_cache_hits: int = 0
    invalid_reasons: list[str] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list)
    server_log: str | None = None
    rounds: list[RoundResult] = Field(default_factory=list, description="every round, warm-ups included")

    @property
    def valid(self) -> bool:
        return not self.invalid_reasons


class KvMeasurement(Model):
    """One launch's KV footprint: what the engine reported and what the process really holds."""

    preset: str
    context: int
    reported_kv_mib: float | None = None
    rss_mib: float
    gpu_used_mib: float | None = Field(
        default=None, description="NVML device memory in use while the server ran (CUDA presets only)"
    )
    pool_tokens: int | None = None


class CapacityResult(Model):
    """KiB/token by difference, the KV pool and its compression against a baseline preset."""

    preset: str
    baseline_preset: str | None = None
    measurements: list[KvMeasurement]
    kib_per_token: float
    kib_source: Literal["rss", "nvml"] = Field(
        default="rss",
        description="host RSS (CPU presets) or NVML device memory (CUDA presets), by difference",
    )
    kib_per_token_reported: float | None = None
    baseline_kib_per_token: float | None = None
    compression: float | None = None
    pool_tokens: int | None = None


class LadderStep(Model):
    users: int
    context: int
    passed: bool
    failed_requests: int = 0
    token_count_mismatches: int = 0
    preemptions: int = 0
    detail: str = ""


class WallProbe(Model):
    context: int
    ok: bool
    decode_tps: float | None = None
    crashed: bool = False
    exit_code: int | None = None
    detail: str = ""


class WallResult(Model):
    """The largest context whose single-user decode still runs; a crash past it is a finding, not an error."""

    preset: str
    probes: list[WallProbe]
    wall_context: int | None
    first_failure: int | None
    findings: list[str] = Field(default_factory=list)


class Temp0Result(Model):
    """Temp-0 token identity against a baseline, with the near-tie rule at the first divergence."""

    preset: str
    baseline_preset: str
    prompts: int
    identical: int
    near_ties: int
    passed: bool
    first_divergence: int | None = None
    logprob_gap: float | None = None
    candidate_text: str = ""
    baseline_text: str = ""
    detail: str = ""


class NeedleTrial(Model):
    depth: float
    length_words: int
    found: bool
    answer: str


class NeedleResult(Model):
    preset: str
    trials: list[NeedleTrial]
    found: int
    total: int
    ci_low: float
    ci_high: float


class PerplexityResult(Model):
    preset: str
    baseline_preset: str | None = None
    ppl: float
    ppl_err: float
    baseline_ppl: float | None = None
    baseline_ppl_err: float | None = None
    delta_pct: float | None = None
    delta_err_pct: float | None = None


class GarbageKind(StrEnum):
    DIGIT_SOUP = "digit_soup"
    REPETITION = "repetition"
    FRAGMENTS = "fragments"
    DROPPED_TAIL = "dropped_tail"


class GarbageFinding(Model):
    kind: GarbageKind
    detail: str


class BuildRequest(Model):
    source: Path | None = Field(default=None, description="a llama.cpp tree; None = the fetched sdist's")
    jobs: int = Field(default=2, ge=1, le=256)


class BuildInfo(Model):
    source: Path
    source_hash: str
    bin_dir: Path


class BenchmarkRequest(Model):
    """One benchmark: a preset (A/B when a baseline is named), a model, a workload."""

    run_id: str = Field(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9_.-]+$")
    preset: Path
    model: Path
    baseline_preset: Path | None = None
    workload: Workload = Field(default_factory=Workload)
    build: BuildRequest = Field(default_factory=BuildRequest)


class BenchmarkSummary(Model):
    """What goes into workflow history: ids and a summary; the rounds are in the artifact."""

    run_id: str
    artifact: Path
    valid: bool
    invalid_reasons: list[str]
    decode_tps_median: dict[int, float]
    flags: list[str] = Field(default_factory=list)


class ProbeKind(StrEnum):
    TEMP0_IDENTITY = "temp0_identity"
    NEEDLE = "needle"
    PERPLEXITY = "perplexity"
    GARBAGE = "garbage"


class ProbeRequest(Model):
    run_id: str = Field(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9_.-]+$")
    probe: ProbeKind
    preset: Path
    model: Path
    baseline_preset: Path | None = None
    corpus: Path | None = Field(default=None, description="perplexity corpus; None = a generated one")
    build: BuildRequest = Field(default_factory=BuildRequest)


class ProbeSummary(Model):
    run_id: str
    probe: ProbeKind
    artifact: Path
    passed: bool | None = Field(
        description="None where the probe has no pass rule of its own (perplexity: gate it with ppl_delta_pct)"
    )
    headline: str
