"""Gates, metrics and verdicts: what a ticket must measure, and how the measurement was judged."""

from collections.abc import Sequence
from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from daedalus.schemas._base import Model, SpecModel
from daedalus.schemas.limits import GATE_NAME_PATTERN, Command, DurationS, Finite


class Direction(StrEnum):
    HIGHER_IS_BETTER = "higher"
    LOWER_IS_BETTER = "lower"


class Metric(StrEnum):
    """Every metric a gate may name. Each maps to one way of measuring it (see METRIC_DIRECTIONS)."""

    DECODE_TPS = "decode_tps"
    PREFILL_TPS = "prefill_tps"
    TTFT_MS = "ttft_ms"
    TPOT_MS = "tpot_ms"
    KV_POOL_TOKENS = "kv_pool_tokens"
    COMPRESSION = "compression"
    KIB_PER_TOKEN = "kib_per_token"
    NEEDLE = "needle"
    TEMP0_IDENTITY = "temp0_identity"
    PPL_DELTA_PCT = "ppl_delta_pct"
    TESTS_PASSED = "tests_passed"
    PREEMPTIONS = "preemptions"
    CONCURRENT_USERS = "concurrent_users"
    MAX_CONCURRENCY = "max_concurrency"
    ACCEPTANCE_LENGTH = "acceptance_length"
    POSITION_ACCEPTANCE = "position_acceptance"
    FLOOR_FRACTION = "floor_fraction"
    DECODE_WORKSPACE_MIB = "decode_workspace_mib"
    SEGMENT_MS = "segment_ms"


METRIC_DIRECTIONS: dict[Metric, Direction] = {
    Metric.DECODE_TPS: Direction.HIGHER_IS_BETTER,
    Metric.PREFILL_TPS: Direction.HIGHER_IS_BETTER,
    Metric.TTFT_MS: Direction.LOWER_IS_BETTER,
    Metric.TPOT_MS: Direction.LOWER_IS_BETTER,
    Metric.KV_POOL_TOKENS: Direction.HIGHER_IS_BETTER,
    Metric.COMPRESSION: Direction.HIGHER_IS_BETTER,
    Metric.KIB_PER_TOKEN: Direction.LOWER_IS_BETTER,
    Metric.NEEDLE: Direction.HIGHER_IS_BETTER,
    Metric.TEMP0_IDENTITY: Direction.HIGHER_IS_BETTER,
    Metric.PPL_DELTA_PCT: Direction.LOWER_IS_BETTER,
    Metric.TESTS_PASSED: Direction.HIGHER_IS_BETTER,
    Metric.PREEMPTIONS: Direction.LOWER_IS_BETTER,
    Metric.CONCURRENT_USERS: Direction.HIGHER_IS_BETTER,
    Metric.MAX_CONCURRENCY: Direction.HIGHER_IS_BETTER,
    Metric.ACCEPTANCE_LENGTH: Direction.HIGHER_IS_BETTER,
    Metric.POSITION_ACCEPTANCE: Direction.HIGHER_IS_BETTER,
    Metric.FLOOR_FRACTION: Direction.HIGHER_IS_BETTER,
    Metric.DECODE_WORKSPACE_MIB: Direction.LOWER_IS_BETTER,
    Metric.SEGMENT_MS: Direction.LOWER_IS_BETTER,
}

# Metrics that are not estimates: a count the engine reports from its own configuration, or events counted
# in the run itself. They are judged as observed, and the verdict says so; every other metric needs an
# interval (MEASUREMENT.md: no zero-width interval from one sample).
EXACT_METRICS: dict[Metric, str] = {
    Metric.KV_POOL_TOKENS: "deterministic: the KV pool the engine reports allocating at start-up",
    Metric.MAX_CONCURRENCY: "deterministic: the engine's start-up maximum concurrency (pool / request length)",
    Metric.TESTS_PASSED: "counted: tests the test runner reported passing in this run",
    Metric.PREEMPTIONS: "counted: preempted or deferred requests observed during the measured rounds",
}


class GateKind(StrEnum):
    ABSOLUTE = "absolute"
    """The metric's confidence interval against a threshold ("decode >= 55 tok/s")."""
    AB = "ab"
    """Paired candidate/baseline ratios, interleaved on one host, against a threshold on the ratio."""


class GateSpec(SpecModel):
    """One acceptance gate of a ticket.

    A gate runs `command` in the attempt's worktree on the ticket's host; the command prints one JSON object
    with the samples (see `GateMeasurement`). An A/B gate's command prints paired `samples` and
    `baseline_samples`, and its threshold is on the candidate/baseline ratio.
    """

    name: str = Field(
        pattern=GATE_NAME_PATTERN,
        description="letters, digits, `.`, `_`, `-`: it names the gate's artifact files",
    )
    metric: Metric
    op: Literal[">=", "<="] | None = None
    threshold: Finite
    kind: GateKind = GateKind.ABSOLUTE
    command: Command
    confidence: Finite = Field(default=0.90, gt=0.5, lt=1.0)
    timeout_s: DurationS = Field(
        default=600,
        description="the command's measuring time; the engine start-ups it records are not counted (see "
        "startup_timeout_s)",
    )
    startup_timeout_s: DurationS = Field(
        default=3600,
        description="all the command's engine start-ups together, on top of timeout_s: each start is bounded by "
        "its preset's health_timeout_s, all of them by this (an alternating A/B starts a server every round)",
    )
    allowed_preemptions: int = Field(default=0, ge=0, le=1_000_000)

    @property
    def comparator(self) -> Literal[">=", "<="]:
        """The stated comparator, or the one the metric's direction implies."""
        if self.op is not None:
            return self.op
        higher = METRIC_DIRECTIONS[self.metric] is Direction.HIGHER_IS_BETTER
        return ">=" if higher or self.kind is GateKind.AB else "<="

    def describe(self) -> str:
        subject = f"{self.metric.value} ratio vs baseline" if self.kind is GateKind.AB else self.metric.value
        return f"{subject} {self.comparator} {self.threshold:g}"


class Provenance(Model):
    """What a measurement measured, so its verdict can be re-derived and trusted later."""

    engine: str = Field(description="llama.cpp or vllm")
    engine_build: str = Field(description="llama.cpp: source tree sha256; vLLM: the installed version")
    engine_flags: list[str] = Field(default_factory=list, description="build flags, or the server's argv")
    preset: str
    preset_sha256: str = ""
    baseline_preset: str | None = None
    model: str = Field(description="a GGUF path, a Hugging Face model directory, or a Hugging Face id")
    model_sha256: str | None = Field(default=None, description="see model_hash_method; None for a hub id")
    model_hash_method: str = ""
    workload: dict[str, str] = Field(default_factory=dict)
    host: str = ""
    commit: str = ""
    artifacts: str = Field(
        default="", description="the directory under the artifact directory with the raw data"
    )


class RoundLoad(Model):
    """The host's load while one measured round ran (gates/contention.py takes it; MEASUREMENT.md "Contention").

    CPU seconds over the round's wall time, on the CPUs the measurement may run on: what the measurement itself
    used (the harness and the engine servers it started), what every other process on the host used (the host's
    busy time in /proc/stat minus the measurement's own), and what the hypervisor gave other guests (steal)."""

    side: str = Field(default="candidate", description="candidate, or baseline in an A/B")
    round: int = Field(ge=0)
    wall_s: float = Field(ge=0)
    cpus: int = Field(ge=1, description="the CPUs the measurement could run on (its affinity)")
    own_cpu_s: float = Field(ge=0, description="the harness and the engine servers it started")
    other_cpu_s: float = Field(ge=0, description="every other process on those CPUs")
    steal_s: float = Field(default=0.0, ge=0, description="time the hypervisor gave other guests")
    ticks: int = Field(
        default=0,
        ge=0,
        description="the kernel's accounting ticks on those CPUs over the round (the resolution of the figures); "
        "0: not recorded, taken as wall_s x cpus x 100",
    )
    load_avg_1m: float | None = Field(default=None, description="at the round's end; recorded, not judged")
    others: list[str] = Field(
        default_factory=list,
        description="the busiest other processes seen from the measurement ('name (pid) CPU-s'); empty where "
        "they are not visible (a gate's sandbox has a pid namespace of its own)",
    )

    @property
    def tick_count(self) -> int:
        """The accounting ticks the round's figures rest on (USER_HZ = 100 where not recorded)."""
        return self.ticks or round(self.wall_s * self.cpus * 100)

    @property
    def share(self) -> float:
        """Of the CPUs' capacity over the round, the part that other work took (other processes and steal)."""
        capacity = self.wall_s * self.cpus
        return (self.other_cpu_s + self.steal_s) / capacity if capacity > 0 else 0.0


class GateMeasurement(SpecModel):
    """What a gate command prints on stdout, as one JSON object.

    Validity fields turn a broken measurement into INVALID instead of a wrong PASS or FAIL.
    """

    samples: list[Finite] = Field(min_length=1)
    baseline_samples: list[Finite] | None = None
    unit: str = ""
    method: str = "command"
    failed_requests: int = Field(default=0, ge=0)
    preemptions: int = Field(default=0, ge=0)
    token_count_mismatches: int = Field(default=0, ge=0)
    invalid_reason: str | None = None
    standard_error: float | None = Field(
        default=None,
        ge=0,
        description="the single sample's own standard error (llama-perplexity's +/-, a fit slope's error)",
    )
    error_dof: int | None = Field(
        default=None,
        ge=1,
        description="degrees of freedom of standard_error (a fit's residual dof); None = normal",
    )
    evidence: dict[str, str] = Field(default_factory=dict)
    provenance: Provenance | None = None
    host_load: list[RoundLoad] = Field(
        default_factory=list,
        description="the host's load during each measured round (candidate, and baseline in an A/B); a speed "
        "metric measured while other work took the host is INVALID unless it passed despite it",
    )

    @model_validator(mode="after")
    def _paired(self) -> "GateMeasurement":
        if self.baseline_samples is not None and len(self.baseline_samples) != len(self.samples):
            raise ValueError(
                f"an A/B measurement needs one baseline sample per candidate sample; got "
                f"{len(self.samples)} candidate and {len(self.baseline_samples)} baseline samples"
            )
        if self.standard_error is not None and (len(self.samples) != 1 or self.baseline_samples is not None):
            raise ValueError(
                "standard_error belongs to a single estimate (one sample, no baseline_samples); repeated "
                f"samples carry their spread themselves, got {len(self.samples)} samples"
            )
        return self


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    """The evidence cannot decide: rerun, then escalate."""
    INVALID = "INVALID"
    """The measurement itself broke; never reported as FAIL."""


def gpu_environment(gpus: Sequence[int], lease_id: str | None = None) -> dict[str, str]:
    """The environment a command on leased GPUs runs with, the one way it is built (gates, campaign cells,
    `run_leased`, training): it sees only `gpus` (CUDA_VISIBLE_DEVICES, in the keeper's index order), and, given
    its `lease_id`, can name its lease (DAEDALUS_LEASE_ID, DAEDALUS_LEASE_GPUS)."""
    visible = ",".join(map(str, gpus))
    if lease_id is None:
        return {"CUDA_VISIBLE_DEVICES": visible}
    return {"CUDA_VISIBLE_DEVICES": visible, "DAEDALUS_LEASE_ID": lease_id, "DAEDALUS_LEASE_GPUS": visible}


class LeaseRecord(Model):
    """The GPU lease a measurement ran under: no other measurement held these GPUs meanwhile."""

    lease_id: str
    host: str
    gpus: list[int]

    def environment(self) -> dict[str, str]:
        """What a command under the lease adds to its environment: it sees only the leased GPUs, and can name
        its lease (`gpu_environment`)."""
        return gpu_environment(self.gpus, self.lease_id)


class GateResult(Model):
    """A gate's verdict with everything needed to re-derive it later without rerunning anything."""

    gate: str
    metric: Metric
    verdict: Verdict
    reason: str
    rule: str
    method: str
    samples: list[float] = Field(default_factory=list)
    baseline_samples: list[float] | None = None
    median: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    cv: float | None = None
    rounds_needed: int | None = Field(
        default=None, description="more samples needed before the interval can reach the confidence asked"
    )
    standard_error: float | None = None
    error_dof: int | None = None
    confidence: float = 0.90
    unit: str = ""
    host: str = ""
    commit: str = ""
    evidence: dict[str, str] = Field(default_factory=dict)
    provenance: Provenance | None = None
    gate_spec: GateSpec | None = Field(
        default=None, description="the gate as judged: re-deriving needs its rule"
    )
    measurement: GateMeasurement | None = Field(
        default=None,
        description="the measurement as judged (without evidence paths): re-deriving needs it whole",
    )
    lease: LeaseRecord | None = Field(default=None, description="the GPU lease it ran under; None: no GPUs")
    host_load: str | None = Field(
        default=None,
        description="the host's load while the measured rounds ran, in one line (each round's figures are in "
        "measurement.host_load); None where the measurement recorded none",
    )
