"""Engine activities on a real Temporal worker, and the gate measure command as a gate would run it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from daedalus.activities.engines import EngineActivities
from daedalus.engines.llama_build import LlamaBuild
from daedalus.engines.presets import PRESET_DIR
from daedalus.schemas.engines import BenchmarkRequest, BenchmarkSummary, BuildInfo, BuildRequest, Workload
from daedalus.schemas.gates import GateMeasurement

pytestmark = pytest.mark.llama


@workflow.defn(sandboxed=False)
class EngineBenchWorkflow:
    @workflow.run
    async def run(self, request: BenchmarkRequest) -> BenchmarkSummary:
        build = await workflow.execute_activity_method(
            EngineActivities.build_engine, request.build, start_to_close_timeout=timedelta(minutes=30),
            heartbeat_timeout=timedelta(seconds=30),
        )  # fmt: skip
        assert isinstance(build, BuildInfo)
        return await workflow.execute_activity_method(
            EngineActivities.run_benchmark, request, start_to_close_timeout=timedelta(minutes=10),
            heartbeat_timeout=timedelta(seconds=30),
        )  # fmt: skip


async def test_benchmark_activity_writes_the_artifact_and_is_idempotent(
    temporal_client: Client, task_queue: str, llama_build: LlamaBuild, tiny_model: Path, tmp_path: Path,
) -> None:  # fmt: skip
    engines = EngineActivities(artifacts=tmp_path)
    request = BenchmarkRequest(
        run_id=f"t-{uuid.uuid4().hex[:8]}", preset=PRESET_DIR / "local-q8_0.yaml", model=tiny_model,
        baseline_preset=PRESET_DIR / "local-f16.yaml", workload=Workload(rounds=3, max_tokens=16),
        build=BuildRequest(source=llama_build.source),
    )  # fmt: skip
    async with Worker(temporal_client, task_queue=task_queue, workflows=[EngineBenchWorkflow],
                      activities=[engines.build_engine, engines.run_benchmark]):  # fmt: skip
        summary = await temporal_client.execute_workflow(
            EngineBenchWorkflow.run, request, id=f"bench-{uuid.uuid4()}", task_queue=task_queue
        )
        again = await temporal_client.execute_workflow(
            EngineBenchWorkflow.run, request, id=f"bench-{uuid.uuid4()}", task_queue=task_queue
        )
    assert summary.valid, summary.invalid_reasons
    assert summary.artifact.is_file() and summary.artifact.is_relative_to(tmp_path)
    assert set(summary.decode_tps_median) == {1} and summary.decode_tps_median[1] > 0
    assert again == summary, "a second run with the same run_id returns the stored result"
    stored = json.loads(summary.artifact.read_text())
    assert stored["baseline_preset"] == "local-f16" and len(stored["rounds"]) == 2 * (1 + 3)


def _measure(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daedalus.engines.measure", *args], capture_output=True,
                          text=True, timeout=240, check=False)  # fmt: skip


def test_measure_prints_a_gate_measurement(llama_build: LlamaBuild, tiny_model: Path, tmp_path: Path) -> None:
    out = _measure("decode_tps", "--preset", "local-f16", "--model", str(tiny_model), "--rounds", "3",
                   "--max-tokens", "16", "--workdir", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stderr
    m = GateMeasurement.model_validate_json(out.stdout)
    assert len(m.samples) == 3 and all(s > 0 for s in m.samples) and m.unit == "tok/s"
    assert m.invalid_reason is None and Path(m.evidence["artifact"]).is_file()


def test_measure_rejects_what_it_cannot_produce(tiny_model: Path) -> None:
    out = _measure("tests_passed", "--preset", "local-f16", "--model", str(tiny_model))
    assert out.returncode == 2 and "tests_passed comes from the ticket's test command" in out.stderr
    out = _measure("decode_tps", "--preset", "local-f16", "--model", "/nonexistent.gguf")
    assert out.returncode == 2 and "does not exist" in out.stderr
