"""Campaigns: a matrix of presets x workloads swept on one host, each cell measured like a gate.

A campaign spec names a base preset and the axes to vary (KV cache type, context, users, speculative k);
every combination is one cell. Each cell is measured with the gates' harness (`engines.measure`) and the
gates' statistics; a cell whose server crashes is a finding (the "wall"), recorded with its evidence. The
campaign closes by proposing the Pareto-best preset that meets the quality constraints, as a decision.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from itertools import product
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from daedalus.ids import CAMPAIGN_PREFIX as CAMPAIGN_PREFIX
from daedalus.ids import campaign_workflow_id as campaign_workflow_id
from daedalus.schemas._base import Model
from daedalus.schemas.engines import LLAMA_CACHE_TYPES, TURBO_AUTO_ASYMMETRIC, VLLM_KV_DTYPES
from daedalus.schemas.limits import LIST_ITEMS, DurationS, Line, Title
from daedalus.schemas.ticket import PERSON_PATTERN, TICKET_ID_PATTERN

MAX_CELLS = 512
"""A campaign's matrix: each cell starts an engine and measures it; more is a typo or several campaigns."""
MAX_CONTEXT = 4 * 1024 * 1024
BASE_KV = "base"
"""A kv axis value: each base preset's own KV type (a campaign across engines, whose KV types differ)."""
MAX_USERS = 4096


class CampaignAxes(Model):
    """The values to sweep; each list holds at least one value, and the cells are their product."""

    kv: list[str] = Field(
        min_length=1,
        max_length=LIST_ITEMS,
        description="KV cache type (K and V alike), or a vLLM kv_cache_dtype",
    )
    context: list[Annotated[int, Field(le=MAX_CONTEXT)]] = Field(
        min_length=1, max_length=LIST_ITEMS, description="per-user context length, tokens"
    )
    users: list[Annotated[int, Field(le=MAX_USERS)]] = Field(
        default_factory=lambda: [1], min_length=1, max_length=LIST_ITEMS
    )
    speculative_k: list[int] = Field(
        default_factory=lambda: [0], min_length=1, max_length=17, description="0 = no speculative decoding"
    )
    lookup: list[tuple[int, int]] | None = Field(
        default=None,
        max_length=LIST_ITEMS,
        description="n-gram lookup windows (prompt_lookup_min, prompt_lookup_max) each speculative cell is measured "
        "with (the seed's speculative-length search: k x window); None: the base preset's window",
    )

    preset: list[Line] | None = Field(
        default=None,
        max_length=8,
        description="base presets to sweep, e.g. one per engine (the calibration table: llama.cpp and vLLM on the "
        "same workload); None: base_preset alone",
    )
    tensor_parallel: list[int] | None = Field(
        default=None,
        max_length=4,
        description="vLLM: tensor-parallel ranks (None: the base preset's); a llama.cpp cell asking for more than "
        "one is invalid, with the reason",
    )

    flash_attn: list[Literal["on", "off"]] | None = Field(
        default=None,
        max_length=2,
        description="llama.cpp: flash attention on and/or off (None: the base preset's; a quantized V cache needs "
        "it on, and a cell that turns it off with one is invalid)",
    )
    batch: list[tuple[int, int]] | None = Field(
        default=None,
        max_length=LIST_ITEMS,
        description="llama.cpp: (batch, micro-batch) sizes, -b and -ub (None: the base preset's)",
    )
    threads: list[int] | None = Field(
        default=None,
        max_length=LIST_ITEMS,
        description="llama.cpp: CPU threads, -t (None: the base preset's)",
    )

    @field_validator("batch")
    @classmethod
    def _batches(cls, values: list[tuple[int, int]] | None) -> list[tuple[int, int]] | None:
        bad = [b for b in values or [] if not 1 <= b[1] <= b[0] <= 65_536]
        if bad:
            raise ValueError(
                f"a batch is (batch, micro-batch) with 1 <= micro-batch <= batch <= 65536; got {bad}"
            )
        return values

    @field_validator("tensor_parallel")
    @classmethod
    def _ranks(cls, values: list[int] | None) -> list[int] | None:
        if any(not 1 <= v <= 64 for v in values or []):
            raise ValueError(f"tensor_parallel ranks must be 1..64; got {values}")
        return values

    @field_validator("threads")
    @classmethod
    def _threads(cls, values: list[int] | None) -> list[int] | None:
        if any(not 1 <= v <= 1024 for v in values or []):
            raise ValueError(f"threads must be 1..1024; got {values}")
        return values

    def engine_settings(self) -> list[tuple[Literal["on", "off"] | None, tuple[int, int] | None, int | None]]:
        """Every (flash attention, batch, threads) the cells vary, None where the base preset's stands."""
        flash: list[Literal["on", "off"] | None] = [*self.flash_attn] if self.flash_attn else [None]
        batches: list[tuple[int, int] | None] = [*self.batch] if self.batch else [None]
        threads: list[int | None] = [*self.threads] if self.threads else [None]
        return list(product(flash, batches, threads))

    @field_validator("lookup")
    @classmethod
    def _windows(cls, values: list[tuple[int, int]] | None) -> list[tuple[int, int]] | None:
        bad = [w for w in values or [] if not 1 <= w[0] <= w[1] <= 64]
        if bad:
            raise ValueError(f"a lookup window is (min, max) with 1 <= min <= max <= 64; got {bad}")
        return values

    @field_validator("kv")
    @classmethod
    def _known_kv(cls, values: list[str]) -> list[str]:
        known = set(LLAMA_CACHE_TYPES) | set(VLLM_KV_DTYPES) | {BASE_KV}
        unknown = [v for v in values if v not in known]
        if unknown:
            raise ValueError(f"unknown KV types {unknown}; known: {', '.join(sorted(known))}")
        return values

    @field_validator("context", "users")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if any(v < 1 for v in values):
            raise ValueError(f"every value must be >= 1; got {values}")
        return values

    @field_validator("speculative_k")
    @classmethod
    def _k(cls, values: list[int]) -> list[int]:
        if any(v < 0 or v > 16 for v in values):
            raise ValueError(f"speculative k must be 0..16; got {values}")
        return values


class QualityConstraints(Model):
    """What a cell must show to be eligible for the proposal (the seed: needle 3/3, clean text, small dPPL)."""

    min_needle_fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    max_ppl_delta_pct: float | None = Field(default=None, description="None: perplexity is not probed")
    forbid_garbage: bool = True
    not_below_baseline: bool = Field(
        default=True,
        description="also no fewer needles and no garbage label beyond the baseline KV's in the same cell",
    )


class CampaignSpec(Model):
    """A campaign as filed (YAML or JSON)."""

    id: str = Field(pattern=TICKET_ID_PATTERN)
    title: str = Field(min_length=1, max_length=200)
    host: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
    base_preset: Line = Field(min_length=1, description="preset name (examples/presets) or YAML path")
    model: Line = Field(min_length=1, description="tiny model name (tiny, small, medium) or a model path")
    models: dict[Literal["llama.cpp", "vllm"], Line] = Field(
        default_factory=dict,
        description="per engine, the model its cells serve (a GGUF for llama.cpp, a Hugging Face directory for "
        "vLLM, e.g. the tiny models of one size: small and tiny-llama); an engine not named serves `model`",
    )
    env: dict[Line, Line] = Field(
        default_factory=dict,
        max_length=LIST_ITEMS,
        description="environment set on every cell's preset, over the base preset's (e.g. the turbo fork's "
        "TURBO_AUTO_ASYMMETRIC=0 for turbo KV cells)",
    )
    axes: CampaignAxes
    baseline_kv: str = Field(default="f16", description="the KV type quality is compared against")
    labels: dict[Line, Title] = Field(
        default_factory=dict,
        max_length=LIST_ITEMS,
        description="display labels per KV type, e.g. {'f16': 'fp16 (baseline)'}",
    )
    rounds: int = Field(default=5, ge=1, le=50)
    max_tokens: int = Field(default=32, ge=2, le=100_000)
    prompt_words: int = Field(default=32, ge=1, le=100_000)
    probe_needle: bool = True
    probe_ppl: bool = False
    probe_identity: bool = Field(
        default=False,
        description="vLLM: temp-0 identity of each speculative cell against the plain (k = 0) cell of its KV type, "
        "context and users, near-tie rule; a cell with a probe that fails is not eligible",
    )
    identity_probes: int = Field(default=8, ge=1, le=60, description="how many of the seed's identity probes")
    probe_floor: bool = Field(
        default=False,
        description="GPU (llama.cpp on CUDA): each cell's decode also as a fraction of the bandwidth floor (the device's "
        "measured copy bandwidth / the model's bytes per token), with its interval",
    )
    speculative_method: Literal["mtp", "ngram", "eagle", "eagle3", "draft_model"] | None = Field(
        default=None,
        description="vLLM: how speculative cells draft; None: the base preset's method, else mtp",
    )
    constraints: QualityConstraints = Field(default_factory=QualityConstraints)
    speed_tolerance: float = Field(
        default=0.05, ge=0.0, lt=1.0, description="presets this close to the fastest count as equally fast"
    )
    deciders: list[str] = Field(default_factory=lambda: ["wayne"], min_length=1, max_length=LIST_ITEMS)
    cell_timeout_s: DurationS = 600
    reminder_interval_s: DurationS | None = Field(
        default=86_400, gt=0, description="remind the deciders of a waiting proposal this often (None: never)"
    )

    @field_validator("deciders")
    @classmethod
    def _people(cls, values: list[str]) -> list[str]:
        import re

        bad = [v for v in values if not re.match(PERSON_PATTERN, v)]
        if bad:
            raise ValueError(f"deciders must be lower-case person names; got {bad}")
        return values

    @model_validator(mode="after")
    def _baseline_in_matrix(self) -> CampaignSpec:
        cells = len(self.cells())
        if cells > MAX_CELLS:
            raise ValueError(
                f"the axes make {cells} cells, more than the {MAX_CELLS} a campaign may measure; split it into "
                f"campaigns over fewer values"
            )
        if self.baseline_kv not in self.axes.kv:
            raise ValueError(
                f"baseline_kv {self.baseline_kv!r} is not among axes.kv {self.axes.kv}; add it, so quality "
                "is compared with a measured baseline"
            )
        if self.constraints.max_ppl_delta_pct is not None and not self.probe_ppl:
            raise ValueError("constraints.max_ppl_delta_pct needs probe_ppl: true")
        if self.probe_identity and 0 not in self.axes.speculative_k:
            raise ValueError(
                "probe_identity compares each speculative cell with plain decoding: add 0 to axes.speculative_k"
            )
        turbo = [kv for kv in self.axes.kv if kv.startswith("turbo")]
        said = self.env.get(TURBO_AUTO_ASYMMETRIC)
        if turbo and said is not None and said != "0":
            raise ValueError(
                f"axes.kv {turbo} with env {TURBO_AUTO_ASYMMETRIC}={said!r}: the auto-asymmetric trap (the turbo "
                f"fork silently promotes K to q8_0); set env {TURBO_AUTO_ASYMMETRIC}: '0', and measure K at q8_0 "
                "as a preset that says so"
            )
        if self.axes.preset is not None and self.base_preset not in self.axes.preset:
            raise ValueError(
                f"base_preset {self.base_preset!r} is not among axes.preset {self.axes.preset}; name it there "
                "too (it is the campaign's first engine)"
            )
        if self.axes.lookup is not None and self.speculative_method not in (None, "ngram"):
            raise ValueError(
                f"axes.lookup windows are n-gram settings; speculative_method is {self.speculative_method!r}"
            )
        return self

    def cells(self) -> list[CampaignCell]:
        """Every combination of the axes, in a stable order (KV outermost, as the seed's tables read)."""
        a = self.axes
        windows: list[tuple[int, int] | None] = [*a.lookup] if a.lookup else [None]
        bases: list[str | None] = [*a.preset] if a.preset else [None]
        ranks: list[int | None] = [*a.tensor_parallel] if a.tensor_parallel else [None]
        return [
            CampaignCell(
                kv=kv, context=ctx, users=users, speculative_k=k, lookup=window, flash_attn=fa, batch=batch,
                threads=threads, base=base, tensor_parallel=tp,
            )
            for base, kv, (fa, batch, threads), tp, ctx, users, k in product(
                bases, a.kv, a.engine_settings(), ranks, a.context, a.users, a.speculative_k
            )
            for window in (windows if k else [None])
        ]  # fmt: skip

    def label(self, kv: str) -> str:
        return self.labels.get(kv, kv)

    def model_for(self, engine: Literal["llama.cpp", "vllm"]) -> str:
        """The model an engine's cells serve."""
        return self.models.get(engine, self.model)


class CampaignCell(Model):
    kv: str
    context: int
    users: int
    speculative_k: int = 0
    lookup: tuple[int, int] | None = Field(default=None, description="the n-gram lookup window (min, max)")
    flash_attn: Literal["on", "off"] | None = None
    batch: tuple[int, int] | None = Field(default=None, description="(batch, micro-batch)")
    threads: int | None = None
    base: str | None = Field(default=None, description="the base preset, when the campaign sweeps several")
    tensor_parallel: int | None = Field(default=None, description="vLLM tensor-parallel ranks")

    def engine_parts(self) -> list[tuple[str, str, str, str]]:
        """(axis, label, key value, preset-name part) of each engine setting this cell sets."""
        parts: list[tuple[str, str, str, str]] = []
        if self.flash_attn is not None:
            parts.append(("flash_attn", self.flash_attn, self.flash_attn, f"fa{self.flash_attn}"))
        if self.batch is not None:
            batch, micro = self.batch
            parts.append(("batch", f"{batch} (ub {micro})", f"{batch}x{micro}", f"b{batch}-ub{micro}"))
        if self.threads is not None:
            parts.append(("threads", str(self.threads), str(self.threads), f"t{self.threads}"))
        return parts

    @property
    def key(self) -> str:
        spec = f"/k={self.speculative_k}" if self.speculative_k else ""
        window = f"/lookup={self.lookup[0]}-{self.lookup[1]}" if self.lookup else ""
        engine = "".join(f"/{axis}={value}" for axis, _, value, _ in self.engine_parts())
        base = f"preset={self.base}/" if self.base else ""
        tp = f"/tp={self.tensor_parallel}" if self.tensor_parallel else ""
        return f"{base}kv={self.kv}/context={self.context}/users={self.users}{spec}{window}{engine}{tp}"

    @property
    def preset_name(self) -> str:
        spec = f"-k{self.speculative_k}" if self.speculative_k else ""
        window = f"-w{self.lookup[0]}-{self.lookup[1]}" if self.lookup else ""
        engine = "".join(f"-{part}" for _, _, _, part in self.engine_parts())
        base = f"{self.base}-" if self.base else ""
        tp = f"-tp{self.tensor_parallel}" if self.tensor_parallel else ""
        return f"{base}{self.kv}-c{self.context}{spec}{window}{engine}{tp}"

    def axes(self) -> dict[str, str]:
        out = {"kv": self.kv, "context": str(self.context), "users": str(self.users)}
        if self.speculative_k:
            out["speculative_k"] = str(self.speculative_k)
        if self.lookup:
            out["lookup"] = f"{self.lookup[0]}-{self.lookup[1]}"
        out.update({axis: label for axis, label, _, _ in self.engine_parts()})
        if self.base:
            out = {"preset": self.base, **out}
        if self.tensor_parallel:
            out["tensor_parallel"] = str(self.tensor_parallel)
        return out

    def plain(self) -> CampaignCell:
        """The cell's plain-decoding counterpart (same KV, context, users and engine settings; k = 0): its
        identity baseline."""
        return self.model_copy(update={"speculative_k": 0, "lookup": None})


class CellOutcome(StrEnum):
    MEASURED = "measured"
    CRASHED = "crashed"
    """The server died or would not start at this point: a finding (the wall), not a harness error."""
    INVALID = "invalid"
    """The measurement broke (failed requests, wrong token counts): its numbers are not read."""


class CellInput(Model):
    """One cell to measure on the campaign's host."""

    campaign_id: str
    spec: CampaignSpec
    cell: CampaignCell
    filing: str = Field(default="", description="the workflow's first run id: the artifact directory's key")
    gpus: list[int] | None = Field(
        default=None, description="the GPUs leased for the cell: the engine sees them as CUDA_VISIBLE_DEVICES"
    )


class CellResult(Model):
    """One measured cell: throughput with its interval, KV footprint, quality probes, or the crash."""

    cell: CampaignCell
    preset: str
    label: str
    outcome: CellOutcome
    decode_tps: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    cv: float | None = None
    samples: list[float] = Field(default_factory=list)
    method: str = ""
    kib_per_token: float | None = None
    needle_found: int | None = None
    needle_total: int | None = None
    needle_lower: float | None = None
    garbage: str = ""
    ppl_delta_pct: float | None = None
    acceptance_length: float | None = Field(
        default=None, description="speculative cells: median tokens per verification step over the rounds"
    )
    identity_passed: int | None = Field(default=None, description="temp-0 identity probes passing vs plain")
    identity_total: int | None = None
    floor_fraction: float | None = Field(
        default=None, description="probe_floor: median decode / the bandwidth floor (GPU)"
    )
    floor_ci_low: float | None = None
    floor_ci_high: float | None = None
    detail: str = ""
    evidence: dict[str, str] = Field(default_factory=dict)
    measured_at: datetime

    STORED_IN_EVIDENCE: ClassVar[tuple[str, ...]] = (
        "acceptance_length",
        "identity_passed",
        "identity_total",
        "floor_fraction",
        "floor_ci_low",
        "floor_ci_high",
    )
    """Figures the store keeps in a cell's evidence (its table has no columns for them)."""

    def stored_evidence(self) -> dict[str, str]:
        """The evidence as the store keeps it: with the figures that have no column of their own."""
        extra = {
            name: str(getattr(self, name))
            for name in self.STORED_IN_EVIDENCE
            if getattr(self, name) is not None
        }
        return {**self.evidence, **extra}


class Proposal(Model):
    """The Pareto front of the eligible cells, and the one preset proposed to the decider."""

    front: list[str] = Field(default_factory=list, description="cell keys on the Pareto front")
    preset: str | None = None
    cell: str | None = None
    reason: str


class CampaignRecord(Model):
    """What the store keeps of a campaign at one moment: its cells so far, and the proposal when closing."""

    campaign_id: str
    spec: CampaignSpec
    status: str
    at: datetime
    cells: list[CellResult] = Field(default_factory=list)
    proposal: Proposal | None = None
    eligible: list[str] = Field(
        default_factory=list, description="cell keys that met the constraints (at close)"
    )
    provenance: dict[str, str] = Field(default_factory=dict)


class CampaignInput(Model):
    spec: CampaignSpec
    control_queue: str = ""
    filed_by: str = Field(default="lead", pattern=PERSON_PATTERN)
    host_gpus: int = Field(
        default=0,
        ge=0,
        description="the GPUs the host declares (hosts.yaml), filled by the starter from the registry: with any, "
        "each cell runs under a lease on all of them",
    )
    ruled_out: dict[str, str] = Field(
        default_factory=dict,
        description="cell presets a standing ruling forbids (name -> the refusal naming the ruling), filled by "
        "the starter from the store: measured like any other, never proposed",
    )


class CampaignStatus(Model):
    campaign_id: str
    status: str
    cells_total: int
    cells_done: int
    cells_crashed: int
    proposal: Proposal | None = None
    decision: str | None = None
