"""What one audit write costs on an SQLite store: `apply` (the idempotence check, the hash chain's predecessor,
the event, the ticket projection) and its commit, as the audit activity runs it, with the store's pragmas (WAL,
SQLite's default `synchronous=full`: an fsync per commit) and, beside it, without the fsync (`synchronous=off`),
so that the fsync's share is read from the difference. Writes are interleaved over tickets, like parked ones.

On a shared machine the absolute times move with the load (reported); read the two side by side.
Run: .venv/bin/python bench/audit_write.py [--tickets 100] [--events 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import event

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daedalus.gates.statistics import quantile_interval  # noqa: E402
from daedalus.schemas.audit import AuditEvent, AuditKind, AuditRecord, TicketSnapshot  # noqa: E402
from daedalus.store.database import make_engine, migrate, session_scope  # noqa: E402
from daedalus.store.records import apply  # noqa: E402
from daedalus.store.seals import AuditKey  # noqa: E402
from record import Recording  # noqa: E402

KEY = AuditKey(os.urandom(32))

RESULTS = ROOT / "bench" / "results" / "audit_write.json"


def record(ticket: int, seq: int) -> AuditRecord:
    ticket_id = f"t{ticket}"
    ids = {"workflow_id": f"ticket-{ticket_id}", "run_id": f"run-{ticket_id}"}
    return AuditRecord(
        event=AuditEvent(
            **ids,
            seq=seq,
            ticket_id=ticket_id,
            kind=AuditKind.TRANSITION,
            actor="daedalus",
            at=datetime.now(UTC),
            status="dispatched",
            summary="attempt 1 dispatched",
        ),
        ticket=TicketSnapshot(
            **ids,
            ticket_id=ticket_id,
            title="bench",
            parent=None,
            kind="ticket",
            host="bench",
            engine="toy",
            agent="scripted",
            status="dispatched",
            attempts=1,
            awaiting=None,
            outcome_reason="",
        ),
    )


def writes_ms(synchronous: str, tickets: int, events: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="daedalus-audit-bench-") as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'store.db'}")

        @event.listens_for(engine, "connect")
        def _synchronous(connection: Any, _record: Any) -> None:
            connection.execute(f"PRAGMA synchronous={synchronous}")

        migrate(engine)
        took = []
        for seq in range(1, events + 1):
            for ticket in range(tickets):
                start = time.perf_counter()
                with session_scope(engine) as session:
                    assert apply(session=session, record=record(ticket, seq), key=KEY)
                took.append((time.perf_counter() - start) * 1000)
        engine.dispose()
        return took


def main(args: argparse.Namespace) -> dict[str, Any]:
    load = [round(x, 2) for x in os.getloadavg()]
    result: dict[str, Any] = {"writes_each": args.tickets * args.events, "load_average_at_start": load}
    for synchronous in ("full", "off"):
        took = sorted(writes_ms(synchronous, args.tickets, args.events))
        result[f"write_p50_ms_{synchronous}"] = round(statistics.median(took), 2)
        result[f"write_p99_ms_{synchronous}"] = round(took[round(0.99 * (len(took) - 1))], 2)
        low, high = quantile_interval(took, 0.99)
        result[f"write_p99_interval_ms_{synchronous}"] = [
            round(low, 2) if low is not None else None,
            round(high, 2) if high is not None else None,
        ]
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def show(result: dict[str, Any]) -> None:
    table = Table(title=f"one audit write on SQLite (WAL), {result['writes_each']} writes each")
    table.add_column("synchronous")
    table.add_column("p50 ms", justify="right")
    table.add_column("p99 ms", justify="right")
    for synchronous in ("full", "off"):
        table.add_row(
            synchronous,
            f"{result[f'write_p50_ms_{synchronous}']}",
            f"{result[f'write_p99_ms_{synchronous}']}",
        )
    Console().print(table)
    print(f"load average {result['load_average_at_start']} -> {result['load_average_at_end']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tickets", type=int, default=100)
    parser.add_argument("--events", type=int, default=5, help="events per ticket")
    arguments = parser.parse_args()
    recording = Recording.start()
    outcome = main(arguments)
    recording.write(outcome, RESULTS)
    show(outcome)
