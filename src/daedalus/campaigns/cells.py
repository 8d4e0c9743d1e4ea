"""Measure one campaign cell on its host, with the gates' harness (`engines.measure`) and verdict rules.

A cell is the base preset with the cell's KV type, context and slots, under the cell's workload. Its decode
throughput is judged by `gates.verdicts.decide` exactly as a gate would be (validity checks, median, interval);
its quality is probed with the needle and the garbage detectors, its footprint measured by difference. A server
that will not start or dies is the cell's finding (CRASHED, with the log), not an error of the campaign.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from daedalus.engines.measure import ensure_build, measure
from daedalus.engines.presets import load_preset
from daedalus.engines.quality import garbage, needle_probe
from daedalus.engines.runner import launched
from daedalus.engines.tiny_model import MODELS, ensure_model
from daedalus.errors import BuildError, EngineError, EngineSetupError
from daedalus.gates.statistics import clopper_pearson
from daedalus.gates.verdicts import decide
from daedalus.schemas.campaigns import CampaignCell, CampaignSpec, CellOutcome, CellResult
from daedalus.schemas.engines import DraftSpec, LlamaCppPreset, SpeculativeConfig, VllmPreset, Workload
from daedalus.schemas.gates import GateSpec, Metric, Verdict

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
    base = load_preset(spec.base_preset)
    if gpus is not None:
        base = base.model_copy(update={"env": {**base.env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}})
    name = cell.preset_name
    if isinstance(base, LlamaCppPreset):
        quantized_v = cell.kv not in QUANTIZED_V_NEEDS_FLASH_ATTN
        return LlamaCppPreset.model_validate(
            {
                **base.model_dump(),
                "name": name,
                "cache_type_k": cell.kv,
                "cache_type_v": cell.kv,
                # llama-server's -c is shared by its slots: each user gets the cell's context
                "context": cell.context * cell.users,
                "parallel": cell.users,
                "flash_attn": "on" if quantized_v else base.flash_attn,
                "draft": DraftSpec(draft_max=cell.speculative_k) if cell.speculative_k else None,
            }
        )
    return VllmPreset.model_validate(
        {
            **base.model_dump(),
            "name": name,
            "kv_cache_dtype": cell.kv,
            "max_model_len": cell.context,
            "max_num_seqs": max(cell.users, base.max_num_seqs or 1),
            "speculative": SpeculativeConfig(num_speculative_tokens=cell.speculative_k)
            if cell.speculative_k
            else None,
        }
    )


def needle_lengths(context: int) -> tuple[int, int]:
    """Haystacks that fit one user's context: about 3 tokens a word with the tiny models' vocabulary, plus the
    question, so a quarter and an eighth of the context in words."""
    return max(16, context // 12), max(32, context // 6)


def model_path(spec: CampaignSpec) -> Path:
    return ensure_model(spec.model) if spec.model in MODELS else Path(spec.model).expanduser()


def _write_preset(preset: LlamaCppPreset | VllmPreset, workdir: Path) -> Path:
    path = workdir / f"{preset.name}.yaml"
    path.write_text(yaml.safe_dump(preset.model_dump(mode="json", exclude_none=True), sort_keys=False))
    return path


def _log_tail(workdir: Path, lines: int = 5) -> str:
    logs = sorted(workdir.rglob("server-*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return ""
    return " | ".join(logs[-1].read_text(errors="replace").strip().splitlines()[-lines:])


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
    model = model_path(spec)
    workload = Workload(
        users=[cell.users], rounds=spec.rounds, max_tokens=spec.max_tokens, prompt_words=spec.prompt_words
    )
    evidence = {"preset": str(preset_path), "workdir": str(workdir)}
    try:
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
    judged = decide(DECODE_GATE, decode, host=host)
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
    try:
        if isinstance(preset, LlamaCppPreset):
            kib = await measure(Metric.KIB_PER_TOKEN, str(preset_path), model, workdir=workdir / "capacity")
            result["kib_per_token"] = kib.samples[0] if kib.invalid_reason is None else None
        if spec.probe_needle:
            # the needle probe `engines.measure` runs for a gate, called directly to keep the answers
            build = await ensure_build() if isinstance(preset, LlamaCppPreset) else None
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


def _not_runnable_here(base: dict[str, Any], error: EngineError) -> CellResult:
    """The worker's setup failed (no build, no model, a port taken): INVALID with what to fix, never a crash,
    which would be read as the preset's wall."""
    return CellResult(
        **base,
        outcome=CellOutcome.INVALID,
        detail=" ".join(f"this worker cannot run the cell: {error}".split())[:300],
        measured_at=datetime.now(UTC),
    )
