"""Contention: the host's load while a gate's rounds ran, and what it does to a speed verdict (MEASUREMENT.md).

What is measured, per measured round, on the CPUs the measurement may run on (its affinity):

* the host's busy CPU time, from /proc/stat (every CPU's user, nice, system, irq and softirq ticks): it counts
  every process on the host, including those a gate's sandbox cannot see, because /proc/stat is not
  namespaced;
* the measurement's own CPU time: the harness process and every process under it (the engine servers), from
  /proc/<pid>/stat, reaped children included;
* steal: time the hypervisor gave other guests while this one wanted to run (a shared VM's neighbours);
* other = busy - own: the CPU every other process took. Where other processes are visible (outside a gate's
  pid namespace) the busiest are named; inside one, the figure stands without names.

Why this signal and not another, on a small shared machine (2 cores): the load average is an exponentially
weighted one-minute mean that lags a round of a few seconds by a minute, counts the engine's own runnable
threads (a llama.cpp server with 2 threads is a load of 2 by itself) and counts tasks sleeping on I/O; it is
recorded beside each round, never judged. Per-process CPU of the whole host is not visible from a sandbox. The
busy-minus-own difference is exact up to the kernel's tick (10 ms per CPU), whatever the sandbox sees.

The rule (`CONTENDED_SHARE`): rounds are contended when other work took at least a quarter of their CPUs'
capacity — half a core on a 2-core host, what a single busy neighbour process takes from an engine that uses
every core — judged by the share's lower confidence bound, because the kernel accounts CPU time in ticks of
10 ms (`share_low`): a 10 ms round on 2 CPUs holds 2 ticks, and one tick elsewhere is not "50% contended". The
measured rounds are judged pooled, and each round on its own (a long round under load is contended by
itself). An idle host's background (the worker's heartbeats, the Temporal server, a database) is a few percent.
Contention only slows a measurement down, so:

* an absolute speed gate (decode_tps, prefill_tps, ttft_ms, tpot_ms, segment_ms, floor_fraction) that PASSes
  despite contended rounds stands, with the load recorded: it cleared the bar with a handicap;
* one that would FAIL, or whose interval straddles the threshold, while its rounds were contended is INVALID,
  the reason naming how much CPU other work took, the rounds contended on their own and, where visible, which
  processes; rounds too short to tell (a few ticks, pooled too) are judged as measured, their load recorded;
* an A/B gate keeps its paired verdict (its rounds run interleaved, each pair on the same host at nearly the
  same time) and records the load of both sides;
* a metric that is not a speed (counts, memory, quality, acceptance) records the load and is judged as before.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import psutil

from daedalus.gates.statistics import clopper_pearson
from daedalus.schemas.gates import (
    METRIC_DIRECTIONS,
    Direction,
    GateKind,
    GateSpec,
    Metric,
    RoundLoad,
    Verdict,
)

CONTENDED_SHARE = 0.25
"""Rounds are contended when other work took at least this share of their CPUs' capacity (see the module)."""
CONFIDENCE = 0.95
"""One-sided: the share's lower bound must clear `CONTENDED_SHARE` at this confidence (see `share_low`)."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
"""The kernel's CPU accounting ticks per second (USER_HZ, 100 on Linux): the resolution of every CPU figure."""

SPEED_METRICS = frozenset({
    Metric.DECODE_TPS, Metric.PREFILL_TPS, Metric.TTFT_MS, Metric.TPOT_MS, Metric.SEGMENT_MS,
    Metric.FLOOR_FRACTION,
})  # fmt: skip
"""Metrics that are speeds: other work on the host's CPUs moves them, always in the worse direction."""

NAMED_OTHERS = 3
"""The busiest other processes named per round (those above `NAMED_MIN_S`)."""
NAMED_MIN_S = 0.05
WORKER_NAMED = 5
"""The busiest other processes the worker names over a whole confined gate."""

SEEN_KEY = "host_others"
"""The evidence key under which the worker names the busiest other processes over a confined gate's run."""


@dataclass(frozen=True)
class Snapshot:
    """CPU counters at one instant: the host's (on the measurement's CPUs), the measurement's own, the others'."""

    at: float
    total_s: float
    busy_s: float
    steal_s: float
    own_s: float
    own_pids: frozenset[int]
    others: dict[tuple[int, str], float] = field(default_factory=dict)


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def _process_cpu(process: psutil.Process) -> float:
    """A process's CPU seconds, with its reaped children's (a child that ended inside a round stays counted)."""
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


ProcessCpu = dict[tuple[int, str], float]
"""CPU seconds (user + system) of each process, by (pid, name)."""


def process_cpu(exclude: set[int] | frozenset[int] = frozenset()) -> ProcessCpu:
    """Every visible process's CPU seconds but those in `exclude` (a sandbox sees only its own)."""
    seen: ProcessCpu = {}
    for process in psutil.process_iter(["name", "cpu_times"]):
        info = process.info
        if process.pid in exclude or info.get("cpu_times") is None:
            continue
        times = info["cpu_times"]
        seen[(process.pid, info.get("name") or "?")] = times.user + times.system
    return seen


def busiest(
    before: ProcessCpu, after: ProcessCpu, *, exclude: frozenset[int] = frozenset(), limit: int = NAMED_OTHERS
) -> list[str]:
    """The processes that took the most CPU between two readings ('name (pid N) X CPU-s'), those alive at both."""
    spent = [(after[key] - before[key], key) for key in after.keys() & before.keys() if key[0] not in exclude]
    return [f"{name} (pid {pid}) {cpu:.2f} CPU-s" for cpu, (pid, name) in sorted(spent, reverse=True)
            if cpu >= NAMED_MIN_S][:limit]  # fmt: skip


class OtherProcesses:
    """What the worker sees of the host around a confined gate: its command runs in a pid namespace of its own,
    so the rounds' loads can say how much CPU other work took but not whose. The worker, outside the sandbox,
    reads every process's CPU before and after the command and names the busiest; the command's own
    processes are not among them (they start after the first reading and are gone by the second)."""

    def __init__(self) -> None:
        self._before = process_cpu(exclude={os.getpid()})

    def busiest(self) -> list[str]:
        return busiest(self._before, process_cpu(exclude={os.getpid()}), limit=WORKER_NAMED)


class LoadMeter:
    """Samples the host's load around each measured round (`snapshot` before and after, then `load`)."""

    def __init__(self) -> None:
        self.cpus = _cpus()
        self._root = psutil.Process()

    def snapshot(self) -> Snapshot:
        per_cpu = psutil.cpu_times(percpu=True)
        chosen = [per_cpu[i] for i in self.cpus if i < len(per_cpu)] or per_cpu
        # guest time is already counted in user (the kernel adds it to both); iowait and idle are not busy.
        busy = sum(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
                   for t in chosen)  # fmt: skip
        steal = sum(getattr(t, "steal", 0.0) for t in chosen)
        # Every tick of these CPUs, whoever it went to (guest and guest_nice are inside user and nice already).
        total = sum(sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0) for t in chosen)
        own_pids = {self._root.pid}
        own = _process_cpu(self._root)
        for child in self._root.children(recursive=True):
            try:
                own += _process_cpu(child)
                own_pids.add(child.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        others = process_cpu(exclude=own_pids)
        return Snapshot(time.monotonic(), total, busy, steal, own, frozenset(own_pids), others)

    def load(self, before: Snapshot, after: Snapshot, *, round_no: int, side: str) -> RoundLoad:
        """The load between two snapshots; its wall time is theirs (the CPU counters' window), which holds the
        round and the few milliseconds of reading the counters."""
        own = max(0.0, after.own_s - before.own_s)
        other = max(0.0, (after.busy_s - before.busy_s) - own)
        named = busiest(before.others, after.others, exclude=after.own_pids)
        try:
            load_avg: float | None = os.getloadavg()[0]
        except OSError:
            load_avg = None
        ticks = round((after.total_s - before.total_s) * CLOCK_TICKS)
        return RoundLoad(side=side, round=round_no, wall_s=max(0.0, after.at - before.at), cpus=len(self.cpus),
                         ticks=max(0, ticks),
                         own_cpu_s=own, other_cpu_s=other, steal_s=max(0.0, after.steal_s - before.steal_s),
                         load_avg_1m=load_avg, others=named)  # fmt: skip


def _counts(loads: list[RoundLoad]) -> tuple[int, int]:
    """(ticks taken by other work, ticks in all) over `loads`: the kernel's samples of who ran on the CPUs."""
    ticks = sum(load.tick_count for load in loads)
    other = sum(round((load.other_cpu_s + load.steal_s) * CLOCK_TICKS) for load in loads)
    return min(max(other, 0), ticks), ticks


def share_low(loads: list[RoundLoad], confidence: float = CONFIDENCE) -> float:
    """The one-sided lower confidence bound of the share other work took over `loads` (Clopper-Pearson on ticks).

    The kernel charges CPU time a tick at a time (1/CLK_TCK s, 10 ms) to whatever runs when the tick comes: a
    round of 10 ms on 2 CPUs holds 2 ticks, and one of them going elsewhere reads as "50%". Counted as pass/miss
    trials, the share has an exact binomial interval: a short round can never be called contended on a tick or
    two, a pool of rounds can, and a long round under load is (0.2 s on 2 CPUs: 40 ticks)."""
    other, ticks = _counts(loads)
    if ticks == 0 or other == 0:
        return 0.0
    low, _ = clopper_pearson(other, ticks, 2 * confidence - 1)
    return low


def describe(load: RoundLoad) -> str:
    """One round's load in words."""
    steal = f", steal {load.steal_s:.2f} s" if load.steal_s >= 0.01 else ""
    avg = f", load avg {load.load_avg_1m:.2f}" if load.load_avg_1m is not None else ""
    who = f": {', '.join(load.others)}" if load.others else ""
    return (f"other work took {load.share:.0%} of {load.cpus} CPUs ({load.other_cpu_s:.2f} CPU-s of other "
            f"processes in {load.wall_s:.2f} s{steal}; the measurement used {load.own_cpu_s:.2f} CPU-s{avg}){who}")  # fmt: skip


def contended(loads: list[RoundLoad], threshold: float = CONTENDED_SHARE) -> list[RoundLoad]:
    """The rounds in which other work took at least `threshold` of the CPUs, each judged on its own ticks."""
    return [load for load in loads if share_low([load]) >= threshold]


@dataclass(frozen=True)
class Contention:
    """Other work over a set of measured rounds: pooled, and the rounds contended on their own."""

    loads: list[RoundLoad]
    share: float
    low: float
    rounds: list[RoundLoad]

    @property
    def contended(self) -> bool:
        return self.low >= CONTENDED_SHARE or bool(self.rounds)

    def line(self) -> str:
        cpus = self.loads[0].cpus
        busiest_round = max(load.share for load in self.loads)
        said = (f"other work took {self.share:.0%} of {cpus} CPUs over {len(self.loads)} measured rounds (at least "
                f"{self.low:.0%} at {CONFIDENCE:.0%}; busiest round {busiest_round:.0%}); "
                + ("contended" if self.contended else "not contended")
                + f" (>= {CONTENDED_SHARE:.0%})")  # fmt: skip
        if self.rounds:
            said += f"; rounds contended on their own: {', '.join(str(load.round) for load in self.rounds)}"
        names = list(dict.fromkeys(n.split(" (pid")[0] for load in self.loads for n in load.others))
        return said + (f"; busiest others: {', '.join(names[:NAMED_OTHERS])}" if names else "")


def pooled(loads: list[RoundLoad]) -> Contention | None:
    """The pooled judgement of `loads` (None when there are none)."""
    if not loads:
        return None
    other, ticks = _counts(loads)
    return Contention(loads, other / ticks if ticks else 0.0, share_low(loads), contended(loads))


def summary(loads: list[RoundLoad]) -> str | None:
    """The measured rounds' load in one line per side (None when the measurement recorded none)."""
    sides = list(dict.fromkeys(load.side for load in loads))
    lines = []
    for side in sides:
        judged = pooled([load for load in loads if load.side == side])
        if judged is not None:
            lines.append((f"{side}: " if sides != ["candidate"] else "") + judged.line())
    return " | ".join(lines) or None


def evidence(loads: list[RoundLoad]) -> dict[str, str]:
    """Each measured round's load as evidence lines, and the summary."""
    lines = {f"load {load.side} round {load.round}": describe(load) for load in loads}
    line = summary(loads)
    return {**({"host_load": line} if line else {}), **lines}


def judged_under_contention(
    gate: GateSpec, verdict: Verdict, loads: list[RoundLoad], *, seen: str | None = None
) -> str | None:
    """Why `verdict` cannot stand (the reason of an INVALID verdict), or None when it can.

    Only an absolute speed gate is judged: contention pushes its metric the worse way, so a verdict that
    contention could have made (FAIL, or an interval straddling the threshold) is not the candidate's when its
    measured rounds were contended (pooled, or any round on its own). A verdict contention works against (a
    PASS) stands."""
    if gate.kind is not GateKind.ABSOLUTE or gate.metric not in SPEED_METRICS:
        return None
    judged = pooled([load for load in loads if load.side == "candidate"])
    if judged is None or not judged.contended:
        return None
    worse_is_failing = (gate.comparator == ">=") == (
        METRIC_DIRECTIONS[gate.metric] is Direction.HIGHER_IS_BETTER
    )
    if verdict is (Verdict.PASS if worse_is_failing else Verdict.FAIL):
        return None
    worst = max(judged.loads, key=lambda load: load.share)
    return (f"the host was busy with other work while the rounds ran: {judged.line()}; busiest round, "
            f"{worst.round}: {describe(worst)}; {gate.metric.value} measured under contention would read "
            f"{verdict.value}, which is not the candidate's: rerun on a quiet host, or gate it as an A/B"
            + (f"; busiest other processes over the gate's run, seen by the worker: {seen}" if seen else ""))  # fmt: skip
