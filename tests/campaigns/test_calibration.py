"""The calibration table (issue 26 item 5; the seed's section 4): one campaign across llama.cpp and vLLM, plain
decoding against n-gram speculation, with the same workload, run on the real engines (llama.cpp's CPU build and
vLLM's CPU build) through the real workflow and store, and shown by the report as the seed's table. The test runs
the example's TP1 cells (two vLLM starts, about 4 minutes); its TP2 cells are checked as presets here.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from daedalus import services as tickets
from daedalus.campaigns.cells import cell_preset
from daedalus.campaigns.spec import load_campaign
from daedalus.engines.hf_tiny_model import ensure_hf_model
from daedalus.engines.vllm_env import installed_environment
from daedalus.errors import EngineSetupError
from daedalus.report import build_report, render_markdown
from daedalus.report.calibration import HEADER
from daedalus.schemas.campaigns import CampaignAxes, CampaignInput, CampaignSpec, campaign_workflow_id
from daedalus.schemas.engines import LlamaCppPreset, VllmPreset
from daedalus.schemas.ticket import Decision
from daedalus.store import queries
from daedalus.store.database import session_scope
from daedalus.workflows.campaign import CampaignWorkflow
from tests.campaigns.test_campaign_workflow import wait_status
from tests.support import running_workers

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "campaigns" / "local-calibration.yaml"


def test_calibration_presets_as_an_axis_are_checked_at_entry_and_give_each_engine_its_cells() -> None:
    spec = load_campaign(EXAMPLE)
    cells = spec.cells()
    assert len(cells) == 8 and {c.base for c in cells} == {"local-f16", "vllm-cpu-ar"}
    with pytest.raises(ValueError, match=r"base_preset .local-q8_0. is not among axes\.preset"):
        CampaignSpec.model_validate({**spec.model_dump(), "base_preset": "local-q8_0"})
    for c in cells:
        if c.base == "local-f16" and c.tensor_parallel == 2:
            with pytest.raises(ValueError, match="tensor_parallel 2 is a vLLM setting"):
                cell_preset(spec, c)
            continue
        preset = cell_preset(spec, c)
        if c.base == "local-f16":
            assert (
                isinstance(preset, LlamaCppPreset) and preset.cache_type_k == "f16"
            )  # kv: base keeps its own
            assert (preset.draft is None) == (c.speculative_k == 0)
            assert preset.draft is None or (preset.draft.method, preset.draft.ngram_size) == (
                "ngram-simple",
                2,
            )
        else:
            assert isinstance(preset, VllmPreset) and preset.kv_cache_dtype == "auto"
            assert preset.tensor_parallel_size == c.tensor_parallel
            if c.tensor_parallel == 2:
                assert preset.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
            assert (preset.speculative is None) == (c.speculative_k == 0)


@pytest.mark.llama
@pytest.mark.timeout(900)
async def test_seed_calibration_table_across_llama_cpp_and_vllm_on_the_real_engines(
    temporal_client: Client, sqlite_engine: Engine, tmp_path: Path, task_queue: str
) -> None:
    try:
        ensure_hf_model("tiny-llama", environment=installed_environment())
    except EngineSetupError as error:
        pytest.fail(f"{error} (the vLLM tests run vLLM's CPU build for real; `make test` installs it)")
    host = f"hc-{task_queue[-8:]}"
    example = load_campaign(EXAMPLE)
    axes = CampaignAxes.model_validate({**example.axes.model_dump(), "tensor_parallel": [1]})
    spec = example.model_copy(update={"host": host, "id": f"cal-{task_queue[-8:]}", "axes": axes})
    async with running_workers(temporal_client, sqlite_engine, tmp_path, task_queue, host):
        handle = await temporal_client.start_workflow(
            CampaignWorkflow.run,
            CampaignInput(spec=spec, control_queue=task_queue),
            id=campaign_workflow_id(spec.id),
            task_queue=task_queue,
        )
        status = await wait_status(handle, "awaiting_decision", limit=840)
        await tickets.decide(
            temporal_client,
            Decision(request_id=f"campaign-{spec.id}-escalation-1", option="reject", decided_by="wayne"),
            store=sqlite_engine,
        )
        assert (await handle.result()).status == "rejected"
    assert status.cells_done == 4 and status.cells_crashed == 0
    with session_scope(sqlite_engine) as session:
        cells = {c.cell: c for c in queries.campaign_cells(session=session, campaign_id=spec.id)}
        report = render_markdown(build_report(session=session, since=datetime.now(UTC) - timedelta(hours=1)))
    for key, c in cells.items():
        assert c.outcome == "measured", (key, c.detail)
        assert c.decode_tps and c.ci_low is not None and len(c.samples) == spec.rounds, key
    vllm_spec = cells["preset=vllm-cpu-ar/kv=base/context=1024/users=1/k=3/lookup=2-4/tp=1"]
    accepted = float(vllm_spec.evidence["acceptance_length"])
    assert 1.0 <= accepted <= 4.0
    lines = report.splitlines()
    header = "| " + " | ".join(HEADER) + " |"  # the English report: the catalogue's source text
    assert "Calibration: AR vs speculative per engine" in report and header in lines, report
    rows = {engine: next(line for line in lines if line.startswith(f"| {engine}, TP1 (k 3, lookup 2-4)"))
            for engine in ("local-f16", "vllm-cpu-ar")}  # fmt: skip
    for engine, row in rows.items():
        ar = cells[f"preset={engine}/kv=base/context=1024/users=1/tp=1"]
        sp = cells[f"preset={engine}/kv=base/context=1024/users=1/k=3/lookup=2-4/tp=1"]
        change = f"{((sp.decode_tps or 0) / (ar.decode_tps or 1) - 1) * 100:+.0f}%"
        assert f"| {change} |" in row and f"{1000 / (ar.decode_tps or 1):.3g} ms |" in row, row
        assert "none: a CPU host has no bandwidth floor here" in row, row
    assert (
        f"{accepted * 1000 / (vllm_spec.decode_tps or 1):.3g} ms ({accepted:.3g} tokens/step)"
        in rows["vllm-cpu-ar"]
    )
    print("\n" + "\n".join([header, *rows.values()]), file=sys.stderr)


@pytest.mark.timeout(600)
async def test_seed_calibration_tp2_cell_runs_two_ranks_on_vllms_cpu_build(tmp_path: Path) -> None:
    """The example's TP2 row: vLLM's CPU build starts two tensor-parallel ranks here, one a core (one vLLM start)."""
    from daedalus.campaigns.cells import measure_cell
    from daedalus.engines.vllm import parse_parallel_log

    try:
        ensure_hf_model("tiny-llama", environment=installed_environment())
    except EngineSetupError as error:
        pytest.fail(f"{error} (the vLLM tests run vLLM's CPU build for real; `make test` installs it)")
    spec = load_campaign(EXAMPLE)
    [tp2] = [
        c for c in spec.cells() if c.base == "vllm-cpu-ar" and c.tensor_parallel == 2 and not c.speculative_k
    ]
    result = await measure_cell(spec, tp2, tmp_path / "tp2")
    assert result.outcome.value == "measured", result.detail
    assert result.decode_tps and len(result.samples) == spec.rounds
    [log] = (tmp_path / "tp2" / "server").rglob("server-*.log")
    parallel = parse_parallel_log(log.read_text(errors="replace"))
    assert (parallel.world_size, parallel.ranks, parallel.cores) == (2, [0, 1], {0: [0], 1: [1]}), parallel
    print(f"\nvllm-cpu-ar TP2 plain: {result.decode_tps:.4g} tok/s ({result.ci_low:.4g}-{result.ci_high:.4g})",
          file=sys.stderr)  # fmt: skip
