"""A small campaign on this CPU, end to end: the durable CampaignWorkflow on the embedded Temporal dev server,
every cell measured by the real host activity on llama-server (tiny model), the matrix stored in SQLite, the
proposal decided, then the HTML report rendered from the store.

Usage: .venv/bin/python bench/campaign.py [-f examples/campaigns/local-kv-matrix.yaml]
Writes bench/results/campaign.json. The matrix must be at least 2 KV types x 3 contexts x 2 user counts.

What the figures are: `campaign_s` is wall time from starting the workflow to the proposal (all cells measured
and stored, one after another); `cell_s` the per-cell wall times; the decode figures are each cell's median
decode tok/s over its rounds with its 90% interval, from llama-server's own timings, on a shared 2-core machine
(compare cells side by side, not with other machines). `report_html_bytes` is the size of the self-contained
HTML report of the campaign.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table
from temporalio.client import Client

from daedalus.campaigns.spec import load_campaign
from daedalus.config import Settings
from daedalus.decisions.schemas import CampaignSubject
from daedalus.devserver import DevServer
from daedalus.engines import paths
from daedalus.payloads import DATA_CONVERTER
from daedalus.ports import free_port
from daedalus.report import build_report, render_html
from daedalus.schemas.campaigns import CampaignInput, CampaignStatus, campaign_workflow_id
from daedalus.schemas.ticket import Decision
from daedalus.services import decide
from daedalus.store import queries
from daedalus.store.database import make_engine, migrate, session_scope
from daedalus.store.seals import AuditKey
from daedalus.worker import WorkerConfig, build_workers
from daedalus.workflows.campaign import CampaignWorkflow
from record import Recording

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "campaign.json"


async def run(spec_path: Path) -> dict[str, object]:
    spec = load_campaign(spec_path)
    a = spec.axes
    if len(a.kv) < 2 or len(a.context) < 3 or len(a.users) < 2:
        sys.exit(f"{spec_path}: the benchmark needs >= 2 KV types x 3 contexts x 2 user counts")
    tmp = Path(tempfile.mkdtemp(prefix="daedalus-bench-campaign-"))
    engine = make_engine(f"sqlite:///{tmp / 'store.db'}")
    migrate(engine)
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    with DevServer(db_file=None, port=free_port(), ui_port=None, die_with_parent=True) as server:
        client = await Client.connect(server.address, data_converter=DATA_CONVERTER)
        config = WorkerConfig(
            control_queue=queue,
            hosts=[spec.host],
            workspace_root=tmp / "ws",
            artifacts=tmp / "artifacts",
            audit_key=AuditKey(os.urandom(32)),
        )
        workers = build_workers(client, config, engine)
        tasks = [asyncio.create_task(w.run()) for w in workers]
        try:
            started = time.perf_counter()
            handle = await client.start_workflow(
                CampaignWorkflow.run,
                CampaignInput(spec=spec, control_queue=queue, filed_by="lead"),
                id=campaign_workflow_id(spec.id),
                task_queue=queue,
            )
            done_at: list[float] = []
            seen = 0
            while True:
                status: CampaignStatus = await handle.query(CampaignWorkflow.status)
                while seen < status.cells_done:
                    seen += 1
                    done_at.append(time.perf_counter() - started)
                    print(f"cell {seen}/{status.cells_total} at {done_at[-1]:.1f}s", file=sys.stderr)
                if status.status in ("awaiting_decision", "no_proposal"):
                    break
                await asyncio.sleep(0.5)
            campaign_s = time.perf_counter() - started
            if status.status == "awaiting_decision":
                await decide(
                    client,
                    Decision(
                        request_id=f"campaign-{spec.id}-escalation-1",
                        option="adopt",
                        decided_by=spec.deciders[0],
                        channel="cli",
                        note="benchmark",
                    ),
                    subject=CampaignSubject(campaign=spec.id),
                )
            await handle.result()
        finally:
            await asyncio.gather(*(w.shutdown() for w in workers))
            await asyncio.gather(*tasks, return_exceptions=True)
    with session_scope(engine) as session:
        cells = list(queries.campaign_cells(session=session, campaign_id=spec.id))
        page = render_html(build_report(session=session, since=datetime.now(UTC) - timedelta(hours=6)))
    html_path = ROOT / "bench" / "results" / "campaign-report.html"
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(page)
    cell_s = [round(b - a, 2) for a, b in zip([0.0, *done_at[:-1]], done_at, strict=True)]
    return {
        "campaign": spec.id,
        "spec": str(spec_path.relative_to(ROOT) if spec_path.is_relative_to(ROOT) else spec_path),
        "cells": len(cells),
        "cells_measured": sum(c.outcome == "measured" for c in cells),
        "cells_crashed": sum(c.outcome == "crashed" for c in cells),
        "cells_invalid": sum(c.outcome == "invalid" for c in cells),
        "pareto_front": status.proposal.front if status.proposal else [],
        "proposal": status.proposal.preset if status.proposal else None,
        "proposal_reason": status.proposal.reason if status.proposal else "",
        "campaign_s": round(campaign_s, 1),
        "cell_s": cell_s,
        "report_html_bytes": len(page.encode()),
        "report_html": str(html_path.relative_to(ROOT)),
        "matrix": [
            {
                "cell": c.cell,
                "outcome": c.outcome,
                "decode_tps_median": c.decode_tps,
                "ci_low": c.ci_low,
                "ci_high": c.ci_high,
                "cv": c.cv,
                "rounds": len(c.samples),
                "kib_per_token": c.kib_per_token,
                "needle": f"{c.needle_found}/{c.needle_total}" if c.needle_total else None,
                "garbage": c.garbage,
                "eligible": c.feasible,
                "detail": c.detail,
            }
            for c in cells
        ],
        "engine": "llama.cpp CPU build, tiny random-weight model",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "-f", "--file", type=Path, default=ROOT / "examples" / "campaigns" / "local-kv-matrix.yaml"
    )
    args = parser.parse_args()
    paths.configure(
        Settings.load().engines
    )  # the engine cache, from DAEDALUS_ENGINES_CACHE_DIR / DAEDALUS_CACHE_DIR
    recording = Recording.start()
    result = asyncio.run(run(args.file))
    recording.write(result, RESULTS)
    table = Table(title=f"campaign {result['campaign']}: {result['cells']} cells in {result['campaign_s']} s")
    for column in (
        "cell",
        "outcome",
        "decode tok/s (median)",
        "90% interval",
        "CV",
        "KiB/token",
        "needle",
        "eligible",
    ):
        table.add_column(column)
    for row in result["matrix"]:  # type: ignore[attr-defined]
        tps = row["decode_tps_median"]
        table.add_row(
            row["cell"],
            row["outcome"],
            "-" if tps is None else f"{tps:.1f}",
            "-" if row["ci_low"] is None else f"[{row['ci_low']:.1f}, {row['ci_high']:.1f}]",
            "-" if row["cv"] is None else f"{row['cv']:.0%}",
            "-" if row["kib_per_token"] is None else f"{row['kib_per_token']:.3f}",
            row["needle"] or "-",
            "yes" if row["eligible"] else "no",
        )
    console = Console()
    console.print(table)
    console.print(f"proposal: {result['proposal']} ({result['proposal_reason']})")
    console.print(f"report: {result['report_html']} ({result['report_html_bytes']} bytes); JSON: {RESULTS}")


if __name__ == "__main__":
    main()
