"""Campaign specs (the examples, bad input) and the proposal rule: eligibility, the Pareto front, the pick."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from daedalus.campaigns.cells import cell_preset
from daedalus.campaigns.pareto import propose
from daedalus.campaigns.spec import CampaignSpecError, load_campaign
from daedalus.engines.presets import load_preset
from daedalus.schemas.campaigns import CampaignCell, CampaignSpec, CellOutcome, CellResult
from daedalus.schemas.engines import LlamaCppPreset, VllmPreset

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "campaigns"
T0 = datetime(2026, 7, 12, tzinfo=UTC)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_campaign_examples_validate_and_every_cell_has_a_preset(path: Path) -> None:
    spec = load_campaign(path)
    cells = spec.cells()
    assert len({c.key for c in cells}) == len(cells) >= 2
    for cell in cells:
        if cell.flash_attn == "off" and cell.kv not in ("f16", "f32", "bf16"):
            # a quantized V cache needs flash attention: such a cell is measured as INVALID and says so
            with pytest.raises(ValueError, match="needs flash_attn 'on'"):
                cell_preset(spec, cell)
            continue
        base = load_preset(cell.base or spec.base_preset)
        if (cell.tensor_parallel or 1) > 1 and isinstance(base, LlamaCppPreset):
            # llama.cpp has no tensor parallelism here: the calibration's llama.cpp TP2 cells say so
            with pytest.raises(ValueError, match="is a vLLM setting"):
                cell_preset(spec, cell)
            continue
        preset = cell_preset(spec, cell)
        if isinstance(preset, LlamaCppPreset):
            assert isinstance(base, LlamaCppPreset)
            kv = base.cache_type_k if cell.kv == "base" else cell.kv
            assert preset.cache_type_k == kv and preset.context == cell.context * cell.users
        else:
            assert isinstance(preset, VllmPreset) and isinstance(base, VllmPreset)
            assert preset.kv_cache_dtype == (base.kv_cache_dtype if cell.kv == "base" else cell.kv)
            assert preset.max_model_len == cell.context
            assert preset.tensor_parallel_size == (cell.tensor_parallel or base.tensor_parallel_size)


def test_the_benchmarks_matrix_is_2_kv_by_3_contexts_by_2_users() -> None:
    spec = load_campaign(EXAMPLES / "local-kv-matrix.yaml")
    assert (len(spec.axes.kv), len(spec.axes.context), len(spec.axes.users)) == (2, 3, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("id: [unclosed", "not valid YAML"),
        ("- a\n- b\n", "a campaign is a mapping"),
        (
            "id: x\ntitle: t\nhost: h\nbase_preset: p\nmodel: tiny\naxes: {kv: [f16], context: [64]}\nbaseline_kv: q8_0\n",
            "baseline_kv 'q8_0' is not among axes.kv",
        ),
        (
            "id: x\ntitle: t\nhost: h\nbase_preset: p\nmodel: tiny\naxes: {kv: [f17], context: [64]}\n",
            "unknown KV types ['f17']",
        ),
        (
            "id: x\ntitle: t\nhost: h\nbase_preset: p\nmodel: tiny\naxes: {kv: [f16], context: [64]}\nrounds: 0\n",
            "rounds: Input should be greater than or equal to 1",
        ),
        (
            "id: x\ntitle: t\nhost: h\nbase_preset: p\nmodel: tiny\naxes: {kv: [f16], context: [64]}\n"
            "constraints: {max_ppl_delta_pct: 1}\n",
            "needs probe_ppl: true",
        ),
        # Unbounded specs: a cell timeout past any int wedged the workflow before campaigns were bounded.
        (
            "id: x\ntitle: t\nhost: h\nbase_preset: p\nmodel: tiny\naxes: {kv: [f16], context: [64]}\n"
            "cell_timeout_s: 1e20\n",
            "cell_timeout_s:",
        ),
        (
            "id: x\ntitle: t\nhost: h\nbase_preset: p\nmodel: tiny\naxes: {kv: [f16], context: [64]}\n"
            "reminder_interval_s: 100000000000\n",
            "reminder_interval_s: Input should be less than or equal to 604800",
        ),
        (
            "id: x\ntitle: t\nhost: h\nbase_preset: p\nmodel: tiny\naxes: {kv: [f16], context: [64]}\n"
            "rounds: 1000000\n",
            "rounds: Input should be less than or equal to 50",
        ),
        # the calibration's axes: base presets (the campaign's own among them) and tensor-parallel ranks
        (
            "id: x\ntitle: t\nhost: h\nbase_preset: p\nmodel: tiny\n"
            "axes: {preset: [local-f16, vllm-cpu-ar], kv: [base], context: [64]}\nbaseline_kv: base\n",
            "base_preset 'p' is not among axes.preset",
        ),
        (
            "id: x\ntitle: t\nhost: h\nbase_preset: p\nmodel: tiny\n"
            "axes: {kv: [f16], context: [64], tensor_parallel: [0]}\n",
            "tensor_parallel ranks must be 1..64",
        ),
        (
            "id: x\ntitle: t\nhost: h\nbase_preset: p\nmodel: tiny\nmodels: {sglang: m}\n"
            "axes: {kv: [f16], context: [64]}\n",
            "models.sglang",
        ),
    ],
)
def test_bad_campaign_files_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(CampaignSpecError, match=None) as caught:
        load_campaign(path)
    assert message in str(caught.value)


def spec(**changes: object) -> CampaignSpec:
    values: dict[str, object] = {
        "id": "m",
        "title": "m",
        "host": "h",
        "base_preset": "local-f16",
        "model": "tiny",
        "axes": {"kv": ["f16", "q8_0", "q4_0"], "context": [256, 512], "users": [1, 2]},
        "constraints": {"min_needle_fraction": 0.5},
    }
    values.update(changes)
    return CampaignSpec.model_validate(values)


def result(
    cell: CampaignCell,
    tps: float | None,
    kib: float | None,
    *,
    found: int = 3,
    garbage: str = "",
    outcome: CellOutcome = CellOutcome.MEASURED,
) -> CellResult:
    return CellResult(
        cell=cell,
        preset=cell.preset_name,
        label=cell.kv,
        outcome=outcome,
        decode_tps=tps,
        kib_per_token=kib,
        needle_found=found,
        needle_total=3,
        garbage=garbage,
        measured_at=T0,
    )


def test_proposal_takes_the_smallest_kv_among_the_equally_fast_and_skips_crashed_presets() -> None:
    s = spec()
    speed = {"f16": 100.0, "q8_0": 98.0, "q4_0": 97.0}
    kib = {"f16": 8.0, "q8_0": 4.25, "q4_0": 2.25}
    results = []
    for cell in s.cells():
        if cell.kv == "q4_0" and cell.context == 512 and cell.users == 2:
            results.append(result(cell, None, None, outcome=CellOutcome.CRASHED))  # the wall
        elif cell.kv == "q4_0":
            results.append(result(cell, speed[cell.kv], kib[cell.kv], found=1))  # 1/3 needles: fails quality
        else:
            results.append(result(cell, speed[cell.kv] - cell.users, kib[cell.kv]))
    proposal, eligible = propose(s, results)
    assert proposal.preset == "q8_0-c512", proposal.reason
    assert (
        "not shown slower than the front's fastest" in proposal.reason
        and "1 cells crashed" in proposal.reason
    )
    assert not any(k.startswith("kv=q4_0") for k in eligible)
    assert all(k.startswith("kv=q8_0/context=512") or "kv=q8_0" not in k for k in proposal.front)
    # when speed is not neutral (q8_0 12% slower), the faster f16 wins
    slow = [r.model_copy(update={"decode_tps": 80.0}) if r.cell.kv == "q8_0" else r for r in results]
    assert propose(s, slow)[0].preset == "f16-c512"
    # ... unless its interval says the gap may be noise: then it is not shown slower, and the smaller KV wins
    noisy = [r.model_copy(update={"ci_high": 99.0}) if r.cell.kv == "q8_0" else r for r in slow]
    assert propose(s, noisy)[0].preset == "q8_0-c512"


def test_relative_quality_compares_with_the_baselines_same_cell_and_nothing_eligible_proposes_nothing() -> (
    None
):
    s = spec(
        axes={"kv": ["f16", "q8_0"], "context": [256], "users": [1]},
        constraints={"min_needle_fraction": 0.0, "not_below_baseline": True},
    )
    [base_cell, q8_cell] = s.cells()
    # the tiny random model finds no needle and writes fragments, in both: q8_0 is no worse than f16
    same = [
        result(base_cell, 50.0, 8.0, found=0, garbage="fragments"),
        result(q8_cell, 50.0, 4.0, found=0, garbage="fragments"),
    ]
    assert propose(s, same)[0].preset == "q8_0-c256"
    worse = [same[0], result(q8_cell, 50.0, 4.0, found=0, garbage="digit_soup, fragments")]
    assert propose(s, worse)[0].preset == "f16-c256"
    crashed = [result(c, None, None, outcome=CellOutcome.CRASHED) for c in s.cells()]
    proposal, eligible = propose(s, crashed)
    assert proposal.preset is None and eligible == set() and "2 cells crashed" in proposal.reason
