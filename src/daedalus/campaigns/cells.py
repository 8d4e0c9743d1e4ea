"""Measure one campaign cell on its host, with the gates' harness (`engines.measure`) and verdict rules.

A cell is the base preset with the cell's KV type, context and slots, under the cell's workload. Its decode
throughput is judged by `gates.verdicts.judge` exactly as a gate would be (validity checks, median, interval);
its quality is probed with the needle and the garbage detectors, its footprint measured by difference. A server
that will not start or dies is the cell's finding (CRASHED, with the log), not an error of the campaign.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml

from daedalus.engines.bench import Side, benchmark
from daedalus.engines.hf_tiny_model import HF_MODELS, ensure_hf_model
from daedalus.engines.llama_build import LlamaBuild
from daedalus.engines.llama_cpp import supported_cache_types
from daedalus.engines.measure import _from_bench, build_config_for, ensure_build, measure
from daedalus.engines.presets import load_preset
from daedalus.engines.quality import (
    garbage,
    greedy_streams,
    identity_probes,
    identity_result,
    judge_identity,
    needle_probe,
)
from daedalus.engines.runner import launched
from daedalus.engines.tiny_model import MODELS, ensure_model
from daedalus.engines.vllm import prefix_caching_problem
from daedalus.errors import BuildError, EngineError, EngineSetupError
from daedalus.gates.statistics import clopper_pearson
from daedalus.gates.verdicts import judge
from daedalus.processes import log_tail
from daedalus.schemas.campaigns import BASE_KV, CampaignCell, CampaignSpec, CellOutcome, CellResult
from daedalus.schemas.engines import (
    DraftSpec,
    GreedyStream,
    IdentityProbe,
    LlamaCppPreset,
    SpeculativeConfig,
    VllmPreset,
    Workload,
)
from daedalus.schemas.gates import GateMeasurement, GateSpec, Metric, Verdict, gpu_environment

QUANTIZED_V_NEEDS_FLASH_ATTN = ("f16", "f32", "bf16")
# The decode figure is judged by the gates' rules against no threshold: the verdict says whether the
# measurement is valid and whether its interval could be computed, never PASS/FAIL on speed.
DECODE_GATE = GateSpec(
    name="campaign-decode", metric=Metric.DECODE_TPS, op=">=", threshold=0.0, command="campaign"
)


def cell_preset(
    spec: CampaignSpec, cell: CampaignCell, gpus: list[int] | None = None
) -> LlamaCppPreset | VllmPreset:
    """The base preset with the cell's axes applied (and the leased `gpus`, when any, as the engine's
    CUDA_VISIBLE_DEVICES); a bad combination raises with the field named."""
    base = load_preset(cell.base or spec.base_preset)
    env = {**base.env, **spec.env}
    if gpus is not None:
        env |= gpu_environment(gpus)
    base = base.model_copy(update={"env": env})
    name = cell.preset_name
    if isinstance(base, LlamaCppPreset):
        if cell.tensor_parallel not in (None, 1):
            raise ValueError(
                f"tensor_parallel {cell.tensor_parallel} is a vLLM setting; {base.name} is a llama.cpp preset, "
                "which runs one process on its device here"
            )
        k_type, v_type = (base.cache_type_k, base.cache_type_v) if cell.kv == BASE_KV else (cell.kv, cell.kv)
        quantized_v = v_type not in QUANTIZED_V_NEEDS_FLASH_ATTN
        engine: dict[str, object] = {
            "flash_attn": cell.flash_attn or ("on" if quantized_v else base.flash_attn)
        }
        if cell.batch is not None:
            engine |= {"batch_size": cell.batch[0], "ubatch_size": cell.batch[1]}
        if cell.threads is not None:
            engine["threads"] = cell.threads
        return LlamaCppPreset.model_validate(
            {
                **base.model_dump(),
                "name": name,
                "cache_type_k": k_type,
                "cache_type_v": v_type,
                # llama-server's -c is shared by its slots: each user gets the cell's context
                "context": cell.context * cell.users,
                "parallel": cell.users,
                "draft": _draft(spec, cell, base.draft),
                **engine,
            }
        )
    set_here = [axis for axis, *_ in cell.engine_parts()]
    if set_here:
        raise ValueError(f"axes {', '.join(set_here)} are llama.cpp settings; {base.name} is a vLLM preset")
    return VllmPreset.model_validate(
        {
            **base.model_dump(),
            "name": name,
            "kv_cache_dtype": base.kv_cache_dtype if cell.kv == BASE_KV else cell.kv,
            "max_model_len": cell.context,
            "max_num_seqs": max(cell.users, base.max_num_seqs or 1),
            "speculative": _speculative(spec, cell, base.speculative),
            **_ranks(cell, base),
        }
    )


def _ranks(cell: CampaignCell, base: VllmPreset) -> dict[str, object]:
    """A cell's tensor-parallel ranks; on vLLM's CPU build each rank is bound to its own core ("0|1"), as the demo
    repo's pool-tp2 preset, unless the base preset binds them itself."""
    if cell.tensor_parallel is None:
        return {}
    out: dict[str, object] = {"tensor_parallel_size": cell.tensor_parallel}
    if (
        cell.tensor_parallel > 1
        and base.environment is not None
        and "VLLM_CPU_OMP_THREADS_BIND" not in base.env
    ):
        bind = "|".join(str(rank) for rank in range(cell.tensor_parallel))
        # one process a rank: the uni executor and in-process engine of a one-rank preset cannot hold two
        extra = [a for a in base.extra_args if a not in ("--distributed-executor-backend", "uni")]
        env = {
            k: v
            for k, v in base.env.items()
            if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS")
        }
        out |= {"env": {**env, "VLLM_CPU_OMP_THREADS_BIND": bind}, "extra_args": extra}
    return out


def _draft(spec: CampaignSpec, cell: CampaignCell, base: DraftSpec | None) -> DraftSpec | None:
    """A llama.cpp cell's drafting: n-gram lookup when the campaign (or the base preset) drafts by n-grams, with the
    cell's lookup window's shortest n-gram (else the base's, else 2); else the target drafting for itself."""
    if not cell.speculative_k:
        return None
    ngram = spec.speculative_method == "ngram" or (
        spec.speculative_method is None and base is not None and base.method == "ngram-simple"
    )
    if not ngram:
        return DraftSpec(draft_max=cell.speculative_k)
    size = (
        cell.lookup[0]
        if cell.lookup
        else (base.ngram_size if base is not None and base.method == "ngram-simple" else 2)
    )
    return DraftSpec(method="ngram-simple", ngram_size=size, draft_max=cell.speculative_k)


def _speculative(
    spec: CampaignSpec, cell: CampaignCell, base: SpeculativeConfig | None
) -> SpeculativeConfig | None:
    """The cell's --speculative-config: the campaign's method (else the base preset's, else MTP) drafting the cell's
    k tokens, n-gram cells with the cell's lookup window (else the base preset's)."""
    if not cell.speculative_k:
        return None
    method = spec.speculative_method or (base.method if base is not None else "mtp")
    fields: dict[str, object] = {"method": method, "num_speculative_tokens": cell.speculative_k}
    if method == "ngram":
        low, high = cell.lookup or (
            (base.prompt_lookup_min, base.prompt_lookup_max) if base is not None else (None, None)
        )
        fields |= {"prompt_lookup_min": low, "prompt_lookup_max": high}
    elif base is not None and base.method == method and base.model is not None:
        fields["model"] = base.model
    return SpeculativeConfig.model_validate(fields)


def decode_of_floor(measured: GateMeasurement) -> GateMeasurement:
    """A floor_fraction measurement's decode rounds, in tok/s (its evidence keeps them beside the fractions)."""
    if measured.invalid_reason is not None:
        return measured
    rounds = [float(v) for v in measured.evidence["decode_tps"].split(", ")]
    return measured.model_copy(update={"samples": rounds, "unit": "tok/s"})


def floor_interval(
    median: float | None, low: float | None, high: float | None, floor: float
) -> dict[str, float | None]:
    """The decode median and its interval as fractions of the floor. The floor is one figure for the whole cell,
    so dividing by it maps the order statistics of the rounds onto those of the fractions: the same interval, at
    the same confidence, in other units."""
    return {
        "floor_fraction": None if median is None else median / floor,
        "floor_ci_low": None if low is None else low / floor,
        "floor_ci_high": None if high is None else high / floor,
    }


def needle_lengths(context: int) -> tuple[int, int]:
    """Haystacks that fit one user's context: about 3 tokens a word with the tiny models' vocabulary, plus the
    question, so a quarter and an eighth of the context in words."""
    return max(16, context // 12), max(32, context // 6)


def model_path(spec: CampaignSpec, engine: Literal["llama.cpp", "vllm"] = "llama.cpp") -> Path:
    """The model an engine's cells serve: a tiny GGUF model or the tiny Hugging Face one by name (written once), or
    a path."""
    model = spec.model_for(engine)
    if model in MODELS:
        return ensure_model(model)
    if model in HF_MODELS:
        return ensure_hf_model(model)
    return Path(model).expanduser()


async def server_build(preset: LlamaCppPreset | VllmPreset) -> LlamaBuild | None:
    """The llama.cpp build a cell's own server runs on: the one its preset's backend needs (a CUDA preset on the
    CUDA build the decode rounds used, never the CPU build, which a GPU host would compile first); none for vLLM."""
    if isinstance(preset, VllmPreset):
        return None
    return await ensure_build(config=build_config_for(preset))


def _write_preset(preset: LlamaCppPreset | VllmPreset, workdir: Path) -> Path:
    path = workdir / f"{preset.name}.yaml"
    path.write_text(yaml.safe_dump(preset.model_dump(mode="json", exclude_none=True), sort_keys=False))
    return path


def _log_tail(workdir: Path, lines: int = 5) -> str:
    logs = sorted(workdir.rglob("server-*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return ""
    return " | ".join(log_tail(logs[-1], lines=lines).strip().splitlines())


async def measure_cell(
    spec: CampaignSpec, cell: CampaignCell, workdir: Path, *, host: str = "", gpus: list[int] | None = None
) -> CellResult:
    """Measure one cell; a crash is returned as a CRASHED cell with its evidence."""
    workdir.mkdir(parents=True, exist_ok=True)
    label = spec.label(cell.kv)
    base = {"cell": cell, "label": label, "preset": cell.preset_name}
    try:
        preset = cell_preset(spec, cell, gpus)
    except (ValueError, EngineError) as error:
        return CellResult(
            **base,
            outcome=CellOutcome.INVALID,
            detail=f"the preset is not valid here: {error}",
            measured_at=datetime.now(UTC),
        )
    preset_path = _write_preset(preset, workdir)
    model = model_path(spec, "vllm" if isinstance(preset, VllmPreset) else "llama.cpp")
    workload = Workload(
        users=[cell.users], rounds=spec.rounds, max_tokens=spec.max_tokens, prompt_words=spec.prompt_words
    )
    evidence = {"preset": str(preset_path), "workdir": str(workdir)}
    if isinstance(preset, VllmPreset):
        return await _measure_vllm_cell(spec, cell, preset, model, workload, workdir, base, evidence, host)
    if spec.probe_floor and preset.backend != "cuda":
        return CellResult(
            **base,
            outcome=CellOutcome.INVALID,
            detail=f"probe_floor measures against a GPU's copy bandwidth; preset {preset.name} runs on the CPU "
            "(base it on a CUDA preset, as the shipped gpu-f16, or drop probe_floor)",
            measured_at=datetime.now(UTC),
        )
    floor: float | None = None
    try:
        unknown = await unknown_cache_types(preset)
        if unknown:
            return CellResult(
                **base,
                outcome=CellOutcome.INVALID,
                detail=unknown,
                evidence=evidence | {"not_runnable": "this build"},
                measured_at=datetime.now(UTC),
            )
        if spec.probe_floor:
            # The floor's measurement is the decode rounds with the copy bandwidth measured before them.
            measured = await measure(
                Metric.FLOOR_FRACTION, str(preset_path), model, workload=workload, workdir=workdir / "decode"
            )
            floor = float(measured.evidence["floor_tps"]) if measured.invalid_reason is None else None
            decode = decode_of_floor(measured)
        else:
            decode = await measure(
                Metric.DECODE_TPS, str(preset_path), model, workload=workload, workdir=workdir / "decode"
            )
    except (EngineSetupError, BuildError) as error:
        return _not_runnable_here(base, error)
    except EngineError as error:
        tail = _log_tail(workdir / "decode")
        evidence["log_tail"] = tail
        return CellResult(
            **base,
            outcome=CellOutcome.CRASHED,
            detail=" ".join(str(error).split())[:300],
            evidence=evidence,
            measured_at=datetime.now(UTC),
        )
    judged = judge(DECODE_GATE, decode, host=host)
    evidence.update({k: v for k, v in decode.evidence.items() if v})
    if judged.verdict is Verdict.INVALID:
        return CellResult(
            **base,
            outcome=CellOutcome.INVALID,
            detail=judged.reason,
            samples=decode.samples,
            evidence=evidence,
            measured_at=datetime.now(UTC),
        )
    result: dict[str, object] = {
        "decode_tps": judged.median,
        "ci_low": judged.ci_low,
        "ci_high": judged.ci_high,
        "cv": judged.cv,
        "samples": decode.samples,
        "method": judged.method,
    }
    if floor is not None:
        result.update(floor_interval(judged.median, judged.ci_low, judged.ci_high, floor))
    try:
        if isinstance(preset, LlamaCppPreset):
            kib = await measure(Metric.KIB_PER_TOKEN, str(preset_path), model, workdir=workdir / "capacity")
            result["kib_per_token"] = kib.samples[0] if kib.invalid_reason is None else None
        if spec.probe_needle:
            # the needle probe `engines.measure` runs for a gate, called directly to keep the answers
            build = await server_build(preset)
            async with launched(preset, model, workdir / "needle", build=build) as server:
                needle = await needle_probe(server, lengths=needle_lengths(cell.context))
            low, _ = clopper_pearson(needle.found, needle.total)
            result.update(needle_found=needle.found, needle_total=needle.total, needle_lower=low)
            # the garbage detectors name what is wrong with the answers: digit soup, repetition, fragments
            labels = {f.kind.value for t in needle.trials for f in garbage(t.answer)}
            result["garbage"] = ", ".join(sorted(labels))
        if spec.probe_ppl and cell.kv != spec.baseline_kv:
            baseline = _write_preset(
                cell_preset(spec, cell.model_copy(update={"kv": spec.baseline_kv}), gpus), workdir
            )
            ppl = await measure(
                Metric.PPL_DELTA_PCT,
                str(preset_path),
                model,
                baseline_ref=str(baseline),
                workdir=workdir / "ppl",
            )
            result["ppl_delta_pct"] = ppl.samples[0] if ppl.invalid_reason is None else None
        elif spec.probe_ppl:
            result["ppl_delta_pct"] = 0.0  # the baseline against itself
    except (EngineSetupError, BuildError) as error:
        return _not_runnable_here(base, error)
    except EngineError as error:
        # decode ran, then a probe broke. A refused request (the server answered 4xx) is a broken measurement;
        # a server that died under the probe is the cell's crash, kept with what was measured so far.
        refused = " answered 4" in str(error)
        return CellResult(
            **base,
            outcome=CellOutcome.INVALID if refused else CellOutcome.CRASHED,
            detail=f"a quality probe {'was refused' if refused else 'crashed'}: {error}"[:300],
            evidence={**evidence, "log_tail": _log_tail(workdir)},
            measured_at=datetime.now(UTC),
            **result,
        )  # type: ignore[arg-type]
    return CellResult(
        **base, outcome=CellOutcome.MEASURED, evidence=evidence, measured_at=datetime.now(UTC), **result
    )  # type: ignore[arg-type]


async def unknown_cache_types(preset: LlamaCppPreset) -> str:
    """Why this host's llama.cpp build cannot run the preset's KV types ('' when it can): the turbo fork's types on
    a stock build are not a crash of the preset (its wall) but a cell this build cannot measure."""
    build = await ensure_build(config=build_config_for(preset))
    known = await asyncio.to_thread(supported_cache_types, build.binary("llama-server"))
    missing = sorted({preset.cache_type_k, preset.cache_type_v} - set(known)) if known else []
    if not missing:
        return ""
    fork = (
        " (the turbo fork's types: run it on a host with the fork's build)"
        if any(m.startswith("turbo") for m in missing)
        else ""
    )
    return (
        f"not runnable on this build: llama.cpp {build.source_hash} does not know KV type {', '.join(missing)}"
        f"{fork}; it knows {', '.join(known)}"
    )


def _not_runnable_here(base: dict[str, Any], error: EngineError) -> CellResult:
    """The worker's setup failed (no build, no model, a port taken): INVALID with what to fix, never a crash,
    which would be read as the preset's wall."""
    return CellResult(
        **base,
        outcome=CellOutcome.INVALID,
        detail=" ".join(f"this worker cannot run the cell: {error}".split())[:300],
        measured_at=datetime.now(UTC),
    )


IDENTITY_STREAMS = "temp0-streams.json"
"""A plain cell's temp-0 streams, kept in its directory: the speculative cells of its group are judged against it."""


def cell_dirname(cell: CampaignCell) -> str:
    """A cell's directory under its campaign's (the key made safe for a file name)."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", cell.key)


async def _measure_vllm_cell(
    spec: CampaignSpec,
    cell: CampaignCell,
    preset: VllmPreset,
    model: Path,
    workload: Workload,
    workdir: Path,
    base: dict[str, Any],
    evidence: dict[str, str],
    host: str,
) -> CellResult:
    """A vLLM cell on one server start (a start costs minutes; the rounds and probes, seconds): decode rounds with
    their acceptance, then the needle and the temp-0 identity probes on the same server. A speculative cell's
    identity is judged against its plain cell's streams, measured before it (k = 0 comes first in its group)."""
    probes = identity_probes(spec.identity_probes) if spec.probe_identity else ()
    try:
        async with launched(preset, model, workdir / "server", build=None) as server:
            problem = await prefix_caching_problem(server)
            bench = await benchmark(Side(name=preset.name, server=server), workload, run_id=cell_dirname(cell),
                                    model=str(model))  # fmt: skip
            needle = (
                await needle_probe(server, lengths=needle_lengths(cell.context))
                if spec.probe_needle
                else None
            )
            streams = await greedy_streams(server, probes) if probes else []
    except (EngineSetupError, BuildError) as error:
        return _not_runnable_here(base, error)
    except EngineError as error:
        evidence["log_tail"] = _log_tail(workdir / "server")
        return CellResult(**base, outcome=CellOutcome.CRASHED, detail=" ".join(str(error).split())[:300],
                          evidence=evidence, measured_at=datetime.now(UTC))  # fmt: skip
    artifact = workdir / "bench.json"
    artifact.write_text(bench.model_dump_json(indent=2))
    if problem:
        bench = bench.model_copy(update={"invalid_reasons": [*bench.invalid_reasons, problem]})
    decode = _from_bench(Metric.DECODE_TPS, bench, artifact)
    judged = judge(DECODE_GATE, decode, host=host)
    evidence.update({k: v for k, v in decode.evidence.items() if v})
    if judged.verdict is Verdict.INVALID:
        return CellResult(**base, outcome=CellOutcome.INVALID, detail=judged.reason, samples=decode.samples,
                          evidence=evidence, measured_at=datetime.now(UTC))  # fmt: skip
    result: dict[str, Any] = {"decode_tps": judged.median, "ci_low": judged.ci_low, "ci_high": judged.ci_high,
                              "cv": judged.cv, "samples": decode.samples, "method": judged.method}  # fmt: skip
    if cell.speculative_k:
        accepted = _from_bench(Metric.ACCEPTANCE_LENGTH, bench, artifact)
        if accepted.invalid_reason is None:
            result["acceptance_length"] = statistics.median(accepted.samples)
            evidence["acceptance_per_round"] = ", ".join(f"{a:.2f}" for a in accepted.samples)
        else:
            evidence["acceptance"] = accepted.invalid_reason
    if needle is not None:
        low, _ = clopper_pearson(needle.found, needle.total)
        result.update(needle_found=needle.found, needle_total=needle.total, needle_lower=low)
        result["garbage"] = ", ".join(
            sorted({f.kind.value for t in needle.trials for f in garbage(t.answer)})
        )
    if probes:
        identity = _identity(cell, probes, streams, workdir, evidence)
        if identity is not None:
            result.update(identity_passed=identity[0], identity_total=identity[1])
    return CellResult(**base, outcome=CellOutcome.MEASURED, evidence=evidence, measured_at=datetime.now(UTC),
                      **result)  # fmt: skip


def _identity(
    cell: CampaignCell,
    probes: tuple[IdentityProbe, ...],
    streams: list[GreedyStream],
    workdir: Path,
    evidence: dict[str, str],
) -> tuple[int, int] | None:
    """A plain cell keeps its streams (and is its own baseline); a speculative one is judged against them."""
    mine = workdir / IDENTITY_STREAMS
    mine.write_text(json.dumps([s.model_dump(mode="json") for s in streams]))
    if not cell.speculative_k:
        return len(streams), len(streams)
    baseline_file = workdir.parent / cell_dirname(cell.plain()) / IDENTITY_STREAMS
    if not baseline_file.is_file():
        evidence["temp0_identity"] = f"no plain cell's streams at {baseline_file}: identity not judged"
        return None
    baseline = [GreedyStream.model_validate(s) for s in json.loads(baseline_file.read_text())]
    judgements = [judge_identity(p, c, b) for p, c, b in zip(probes, streams, baseline, strict=True)]
    result = identity_result(cell.preset_name, cell.plain().preset_name, judgements)
    (workdir / "temp0_identity.json").write_text(result.model_dump_json(indent=2))
    evidence["temp0_identity"] = result.detail
    return sum(j.passed for j in judgements), len(judgements)
