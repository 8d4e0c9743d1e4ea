"""A verdict re-derived from the store alone: samples, gate spec, measurement and provenance are all kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import select
from typer.testing import CliRunner

from daedalus.cli import app
from daedalus.cli.verdicts import stored_result
from daedalus.gates.verdicts import judge, rederive
from daedalus.schemas.audit import AuditKind
from daedalus.schemas.gates import GateMeasurement, GateSpec, Provenance, Verdict
from daedalus.store import queries
from daedalus.store.database import make_engine, migrate, session_scope
from daedalus.store.tables import VerdictRow
from tests.store.test_records import record, write

GATE = GateSpec(
    name="single-user-mtp2", metric="decode_tps", threshold=55, command="daedalus engine measure ..."
)
PROVENANCE = Provenance(
    engine="vllm", engine_build="0.10.1.1", preset="vllm-single-user-mtp2", baseline_preset=None,
    model="Qwen/Qwen3-30B-A3B", model_hash_method="Hugging Face id", host="", artifacts="/srv/daedalus/artifacts/m1",
)  # fmt: skip


def stored(engine: Engine, samples: list[float]) -> int:
    measurement = GateMeasurement(samples=samples, unit="tok/s", method="benchmark server timings",
                                  provenance=PROVENANCE, evidence={"artifact": "/srv/a/bench.json"})  # fmt: skip
    result = judge(GATE, measurement, host="mavis", commit="f7332846")
    write(engine, record(3, kind=AuditKind.GATE, status="gating", gate_results=[result], attempt=1))
    with session_scope(engine) as session:
        row = session.exec(select(VerdictRow).order_by(VerdictRow.id.desc())).first()  # type: ignore[union-attr]
        assert row is not None and row.id is not None
        return row.id


def test_a_stored_verdict_rederives_to_the_same(store_engine: Engine) -> None:
    verdict_id = stored(store_engine, [56.0, 56.3, 55.6, 56.1, 55.9, 56.2, 56.0])
    with session_scope(store_engine) as session:
        row = queries.verdict(session=session, verdict_id=verdict_id)
        assert row is not None
        result = stored_result(row)
    assert result.verdict is Verdict.PASS and result.provenance is not None
    assert result.provenance.host == "mavis" and result.provenance.commit == "f7332846"
    assert (
        result.provenance.model == "Qwen/Qwen3-30B-A3B" and result.evidence["artifact"] == "/srv/a/bench.json"
    )
    again = rederive(result)
    assert (again.verdict, again.ci_low, again.ci_high) == (result.verdict, result.ci_low, result.ci_high)


def test_the_cli_rederives_and_catches_a_tampered_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAEDALUS_HOME", str(tmp_path))
    monkeypatch.delenv("DAEDALUS_DATABASE_URL", raising=False)
    engine = make_engine(f"sqlite:///{tmp_path / 'daedalus.db'}")
    migrate(engine)
    verdict_id = stored(engine, [55.6, 56.0, 56.3])  # three rounds: INCONCLUSIVE, 2 more needed
    runner = CliRunner()
    done = runner.invoke(app, ["verdict", "rederive", str(verdict_id)])
    assert done.exit_code == 0, done.output
    assert (
        "INCONCLUSIVE" in done.output and "2 more rounds" in done.output and "the same verdict" in done.output
    )
    with session_scope(engine) as session:
        row = session.get(VerdictRow, verdict_id)
        assert row is not None
        row.verdict = "PASS"  # what the percentile bootstrap used to say "at 90%"
        session.add(row)
    tampered = runner.invoke(app, ["verdict", "rederive", str(verdict_id)])
    assert tampered.exit_code == 1 and "differs" in tampered.output
    listed = runner.invoke(app, ["verdict", "list", "--ticket", "4"])
    assert listed.exit_code == 0 and "single-user-mtp2" in listed.output
    missing = runner.invoke(app, ["verdict", "rederive", "999"])
    assert missing.exit_code == 2 and "no verdict with id 999" in missing.output
