"""Contention is part of the evidence (MEASUREMENT.md): the rule on recorded loads, and the meter on a real host.

The rule: an absolute speed gate that would FAIL (or straddle its threshold) while other work took the host is
INVALID with the reason; a PASS despite the load stands; an A/B keeps its paired verdict; a non-speed metric is
judged as measured. The meter: CPU spun by processes outside the measurement is seen as other work, with the
processes named; CPU spun by the measurement's own children is its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from daedalus.gates import contention
from daedalus.gates.contention import CONTENDED_SHARE, LoadMeter
from daedalus.gates.verdicts import judge, rederive
from daedalus.schemas.gates import GateMeasurement, GateResult, GateSpec, RoundLoad, Verdict

SLOW = [50.0, 51.0, 49.5, 50.5, 50.2, 49.8, 50.9]  # decode tok/s: below a 55 bar, above a 40 one


def load(
    round_no: int, other_cpu_s: float, *, side: str = "candidate", others: list[str] | None = None
) -> RoundLoad:
    return RoundLoad(side=side, round=round_no, wall_s=1.0, cpus=2, own_cpu_s=1.5, other_cpu_s=other_cpu_s,
                     load_avg_1m=2.0, others=others or [])  # fmt: skip


def gate(metric: str = "decode_tps", threshold: float = 55, **extra: object) -> GateSpec:
    return GateSpec.model_validate(
        {"name": "g", "metric": metric, "threshold": threshold, "command": "measure", **extra}
    )


QUIET = [load(i, 0.04) for i in range(7)]  # 2% of 2 CPUs: an idle host's background
BUSY = [load(i, 1.6 if i in (2, 3, 5) else 0.04, others=["burn (pid 4242) 0.80 CPU-s"]) for i in range(7)]


def test_a_fail_on_a_quiet_host_stays_a_fail_and_carries_its_load() -> None:
    result = judge(gate(), GateMeasurement(samples=SLOW, unit="tok/s", host_load=QUIET))
    assert result.verdict is Verdict.FAIL, result.reason
    assert result.host_load is not None and "2% of 2 CPUs over 7 measured rounds" in result.host_load
    assert "not contended (>= 25%)" in result.host_load, result.host_load
    assert result.measurement is not None and result.measurement.host_load == QUIET


def test_a_fail_measured_while_the_host_was_busy_is_invalid_and_names_the_contention() -> None:
    result = judge(gate(), GateMeasurement(samples=SLOW, unit="tok/s", host_load=BUSY))
    assert result.verdict is Verdict.INVALID, result.reason
    assert (
        "the host was busy with other work while the rounds ran: other work took 35% of 2 CPUs"
        in result.reason
    )
    assert "rounds contended on their own: 2, 3, 5" in result.reason
    assert "other work took 80% of 2 CPUs" in result.reason and "burn (pid 4242)" in result.reason
    assert "median 50.2" in result.reason, "the figures measured stay in the reason"
    assert result.host_load is not None and "; contended (>= 25%)" in result.host_load
    assert "busiest others: burn" in result.host_load
    assert rederive(result).verdict is Verdict.INVALID, (
        "the load is part of what a verdict is re-derived from"
    )


def test_a_pass_despite_the_load_stands() -> None:
    result = judge(gate(threshold=40), GateMeasurement(samples=SLOW, unit="tok/s", host_load=BUSY))
    assert result.verdict is Verdict.PASS, result.reason
    assert "the rounds ran while other work took the host" in result.reason


def test_an_interval_straddling_the_threshold_under_load_is_invalid_not_inconclusive() -> None:
    result = judge(gate(threshold=50.3), GateMeasurement(samples=SLOW, unit="tok/s", host_load=BUSY))
    assert result.verdict is Verdict.INVALID and "INCONCLUSIVE" in result.reason, result.reason
    quiet = judge(gate(threshold=50.3), GateMeasurement(samples=SLOW, unit="tok/s", host_load=QUIET))
    assert quiet.verdict is Verdict.INCONCLUSIVE, quiet.reason


def test_a_latency_gate_is_judged_in_its_own_direction() -> None:
    ttft = [120.0, 118.0, 125.0, 121.0, 119.0, 122.0, 124.0]
    failed = judge(gate("ttft_ms", 100), GateMeasurement(samples=ttft, unit="ms", host_load=BUSY))
    assert failed.verdict is Verdict.INVALID and "ttft_ms" in failed.reason, failed.reason
    passed = judge(gate("ttft_ms", 200), GateMeasurement(samples=ttft, unit="ms", host_load=BUSY))
    assert passed.verdict is Verdict.PASS, passed.reason
    # A bound stated against the metric's direction ("at least 200 ms") is one contention could make pass.
    against = judge(gate("ttft_ms", 110, op=">="), GateMeasurement(samples=ttft, unit="ms", host_load=BUSY))
    assert against.verdict is Verdict.INVALID, against.reason


def test_an_ab_gate_keeps_its_paired_verdict_with_both_sides_loads() -> None:
    baseline = [s / 1.2 for s in SLOW]
    loads = BUSY + [load(i, 1.6, side="baseline") for i in range(7)]
    result = judge(gate(threshold=1.1, kind="ab"),
                    GateMeasurement(samples=SLOW, baseline_samples=baseline, unit="tok/s", host_load=loads))  # fmt: skip
    assert result.verdict is Verdict.PASS, result.reason
    assert "paired rounds share it" in result.reason
    assert result.host_load is not None and "candidate: other work took 35%" in result.host_load
    assert "| baseline: other work took 80% of 2 CPUs over 7 measured rounds" in result.host_load


def test_a_metric_that_is_not_a_speed_is_judged_as_measured() -> None:
    result = judge(
        gate("kib_per_token", 10), GateMeasurement(samples=[12.0], standard_error=0.1, host_load=BUSY)
    )
    assert result.verdict is Verdict.FAIL, result.reason
    assert "not a speed" in result.reason


def test_stored_results_without_a_load_still_read_and_decide_as_before() -> None:
    """Results recorded before loads were: the new fields are optional, and no load means no contention rule."""
    stored = {"gate": "g", "metric": "decode_tps", "verdict": "FAIL", "reason": "r", "rule": "decode_tps >= 55",
              "method": "m", "samples": SLOW,
              "measurement": {"samples": SLOW, "unit": "tok/s", "method": "m"}}  # fmt: skip
    result = GateResult.model_validate(stored)
    assert result.host_load is None and result.measurement is not None and result.measurement.host_load == []
    assert judge(gate(), result.measurement).verdict is Verdict.FAIL


def test_the_share_counts_steal_and_is_zero_for_an_empty_round() -> None:
    stolen = RoundLoad(round=0, wall_s=2.0, cpus=2, own_cpu_s=1.0, other_cpu_s=0.2, steal_s=0.8)
    assert stolen.share == pytest.approx(0.25) and stolen.tick_count == 400
    # 25% of 400 ticks is a share whose lower bound falls short of 25%: not contended on its own; 50% is.
    assert contention.contended([stolen]) == []
    assert contention.contended([stolen.model_copy(update={"steal_s": 1.8})]) != []
    assert "steal 0.80 s" in contention.describe(stolen)
    assert RoundLoad(round=0, wall_s=0.0, cpus=2, own_cpu_s=0.0, other_cpu_s=0.0).share == 0.0


def test_a_round_of_a_few_ticks_is_never_contended_on_them() -> None:
    """10 ms on 2 CPUs is 2 accounting ticks: one of them elsewhere reads 50% and proves nothing; the pool of
    many such rounds, or a long round, can prove it."""
    short = [
        RoundLoad(round=i, wall_s=0.01, cpus=2, own_cpu_s=0.01, other_cpu_s=0.01, ticks=2) for i in range(5)
    ]
    assert all(load.share == pytest.approx(0.5) for load in short)
    assert contention.contended(short) == [] and contention.share_low(short) < CONTENDED_SHARE
    fail = judge(gate(), GateMeasurement(samples=SLOW[:5], unit="tok/s", host_load=short))
    assert fail.verdict is Verdict.FAIL, fail.reason
    many = [load.model_copy(update={"round": i}) for i in range(60) for load in short[:1]]
    assert contention.share_low(many) >= CONTENDED_SHARE


SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


@pytest.fixture
def outside_burner() -> Iterator[list[int]]:
    """Processes spinning on every CPU that are not under this process (double-forked: their parent is gone),
    as another user's work on a shared host is. Ended by their ids."""
    pids: list[int] = []
    for _ in range(len(os.sched_getaffinity(0))):
        out = subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', SPIN],
                             capture_output=True, text=True, check=True)  # fmt: skip
        pids.append(int(out.stdout.strip()))
    time.sleep(0.3)
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _window(meter: LoadMeter, seconds: float) -> RoundLoad:
    before = meter.snapshot()
    time.sleep(seconds)
    return meter.load(before, meter.snapshot(), round_no=0, side="candidate")


def test_the_meter_sees_other_processes_spinning_and_names_them(outside_burner: list[int]) -> None:
    meter = LoadMeter()
    before = meter.snapshot()
    time.sleep(1.5)
    after = meter.snapshot()
    measured = meter.load(before, after, round_no=0, side="candidate")
    assert measured.share >= CONTENDED_SHARE * 2, contention.describe(measured)
    assert contention.share_low([measured]) >= CONTENDED_SHARE, contention.describe(measured)
    assert measured.own_cpu_s < 0.5, contention.describe(measured)
    assert len(measured.others) <= contention.NAMED_OTHERS
    # On a shared host the burners need not be the three busiest; every process above 0.05 CPU-s is ranked.
    ranked = contention.busiest(before.others, after.others, exclude=after.own_pids, limit=1000)
    assert all(f"(pid {pid})" in " ".join(ranked) for pid in outside_burner), ranked


def test_the_measurements_own_children_are_its_own() -> None:
    """A process under the harness (the engine server) spinning is the measurement's CPU, not contention."""
    import psutil

    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.3)
        spun = psutil.Process(child.pid).cpu_times()
        measured = _window(LoadMeter(), 1.5)
        after = psutil.Process(child.pid).cpu_times()
    finally:
        child.kill()
        child.wait()
    child_s = (after.user + after.system) - (spun.user + spun.system)
    assert child_s > 0.1, "the child spun"
    # All the child spun is the measurement's own (up to the ticks between the readings).
    assert measured.own_cpu_s >= child_s - 0.05, (child_s, contention.describe(measured))
    assert not any(f"(pid {child.pid})" in name for name in measured.others), measured.others


def test_ticket_show_puts_each_attempts_host_load_beside_its_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    from daedalus.cli import tickets as ticket_cli
    from daedalus.schemas.ticket import AttemptOutcome, AttemptSummary, TicketSpec, TicketState, TicketStatus

    spec = TicketSpec.model_validate({"id": "t", "title": "decode", "host": "h", "gates": [
        {"name": "g", "metric": "decode_tps", "threshold": 55, "command": "measure"}]})  # fmt: skip
    busy = judge(gate(), GateMeasurement(samples=SLOW, unit="tok/s", host_load=BUSY))
    quiet = judge(gate(), GateMeasurement(samples=SLOW, unit="tok/s", host_load=QUIET))
    attempts = [
        AttemptSummary(number=n, branch=f"b{n}", outcome=AttemptOutcome.GATES_FAILED, gate_results=[result])
        for n, result in ((1, busy), (2, quiet))
    ]
    out = io.StringIO()
    monkeypatch.setattr(ticket_cli, "console", Console(file=out, width=600))
    ticket_cli.print_state(TicketState(spec=spec, status=TicketStatus.GATING, attempts=attempts))
    row = next(line for line in out.getvalue().splitlines() if "host load" in line)
    assert "; contended (>= 25%)" in row and "not contended (>= 25%)" in row, row
    assert "INVALID" in out.getvalue() and "FAIL" in out.getvalue()


def test_the_consoles_attempts_side_by_side_show_the_host_load() -> None:
    from pathlib import Path

    import jinja2

    from daedalus.api.console import views
    from daedalus.schemas.ticket import AttemptOutcome, AttemptSummary

    busy = judge(gate(), GateMeasurement(samples=SLOW, unit="tok/s", host_load=BUSY))
    attempt = AttemptSummary(number=1, branch="b1", outcome=AttemptOutcome.GATES_FAILED, gate_results=[busy])
    sbs = views.side_by_side([attempt])
    cell = sbs.gates[0].cells[0]
    assert cell is not None and cell.host_load == busy.host_load
    templates = Path(views.__file__).parent / "templates"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), autoescape=True)
    html = env.get_template("_attempts.html").render(sbs=sbs)
    assert "host load: other work took 35% of 2 CPUs over 7 measured rounds" in html, html
