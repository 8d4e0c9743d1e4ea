"""A trainer's death: the kernel's OOM evidence, its class, and the evidence kept.

A SIGKILL is a kernel OOM only with evidence (the oom_kill counters moved, or the kernel log names the pid);
a death after our stop is ours whatever the signal. The curve and the log's tail are copied into the artifact
store; history carries only their paths.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

from daedalus.processes import log_tail
from daedalus.schemas.training import Death, DeathClass, StopReason
from daedalus.training.curve import CURVE_FILE
from daedalus.training.incarnation import DEATH_FILE, OOM_BASELINE_FILE
from daedalus.training.memory import OomCounters, cgroup_oom_file, kernel_log_oom, oom_counters
from daedalus.training.trainer_keeper import LOG_FILE

LOG_TAIL_BYTES = 16_000


def oom_evidence(
    before: OomCounters, after: OomCounters, kernel_log_line: str | None
) -> tuple[list[str], int | None]:
    """Evidence of a kernel OOM kill between two counter readings, and the host-wide oom_kill delta."""
    evidence: list[str] = []
    delta = None
    if before.vmstat is not None and after.vmstat is not None:
        delta = after.vmstat - before.vmstat
        if delta > 0:
            evidence.append(f"/proc/vmstat oom_kill +{delta} during the run (host-wide)")
    if before.cgroup is not None and after.cgroup is not None and after.cgroup > before.cgroup:
        evidence.append(
            f"{after.cgroup_file} oom_kill +{after.cgroup - before.cgroup} (the trainer's memory cgroup)"
        )
    if kernel_log_line:
        evidence.append(f"kernel log: {kernel_log_line}")
    return evidence, delta


def classify(
    returncode: int | None, stop: StopReason | None, error: str | None = None, oom: list[str] | None = None
) -> tuple[DeathClass, str | None, str]:
    """(class, signal name, one-line summary) of an exit status, given whether we had asked it to stop and
    what the kernel's OOM counters and log say: a SIGKILL is a kernel OOM only with that evidence."""
    sig: str | None = None
    if returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
    elif returncode in (137, 143):
        sig = "SIGKILL" if returncode == 137 else "SIGTERM"  # 128 + n, as a shell reports a killed child
    how = f"exit code {returncode}" if sig is None else f"killed by {sig}"
    if stop is not None:
        cls = (
            DeathClass.REQUESTED_STOP
            if stop in (StopReason.REQUESTED, StopReason.CANCELLED)
            else DeathClass.WATCHDOG_STOP
        )
        return cls, sig, f"our graceful stop ({stop.value}); {how}"
    if returncode is None:
        return DeathClass.LOST, None, "the trainer is gone and its exit status was not recorded"
    if error is not None:
        return DeathClass.CRASH, None, f"could not start: {error}"
    if sig == "SIGKILL":
        if oom:
            return DeathClass.KERNEL_OOM, sig, "SIGKILL by the kernel's OOM killer: " + "; ".join(oom)
        return (
            DeathClass.OUTSIDE_SIGKILL,
            sig,
            "killed by SIGKILL from outside (sender unknown): no OOM evidence (oom_kill counters unchanged, "
            "no kernel log record)",
        )
    if sig == "SIGTERM":
        return (
            DeathClass.OUTSIDE_SIGTERM,
            sig,
            "SIGTERM from someone else (earlyoom? systemd-oomd? a person?)",
        )
    if sig is not None:
        return DeathClass.OUTSIDE_SIGNAL, sig, f"{how}, not sent by us"
    if returncode == 0:
        return DeathClass.CLEAN_EXIT, None, "exited cleanly"
    return DeathClass.CRASH, None, f"crashed with {how}"


def recorded(run_dir: Path, classify_death: Callable[[], Death]) -> Death:
    """Classify the incarnation's end once; a retried call returns the same recorded death."""
    known = run_dir / DEATH_FILE
    if known.exists():
        return Death.model_validate_json(known.read_text())
    death = classify_death()
    tmp = known.with_suffix(".tmp")
    tmp.write_text(death.model_dump_json())
    os.replace(tmp, known)
    return death


def write_oom_baseline(run_dir: Path, own: Path | None) -> None:
    """The OOM counters before the launch: the trainer's own cgroup's (`own`), or else this process's (which the
    trainer inherits)."""
    baseline = oom_counters(own or cgroup_oom_file(os.getpid()))
    (run_dir / OOM_BASELINE_FILE).write_text(json.dumps(dataclasses.asdict(baseline)))


def oom_evidence_since_launch(run_dir: Path, pid: int | None) -> tuple[list[str], int | None]:
    """What the kernel says about OOM kills during the run, and the host-wide oom_kill delta."""
    try:
        raw = json.loads((run_dir / OOM_BASELINE_FILE).read_text())
    except (OSError, ValueError):
        raw = None
    if isinstance(raw, int):  # written by an earlier version: the host-wide count only
        raw = {"vmstat": raw}
    before = OomCounters(**raw) if isinstance(raw, dict) else OomCounters()
    cgroup_file = Path(before.cgroup_file) if before.cgroup_file else None
    return oom_evidence(before, oom_counters(cgroup_file), kernel_log_oom(pid) if pid is not None else None)


def keep_evidence(run_dir: Path, artifact_dir: Path) -> tuple[str | None, str | None]:
    """Copy the memory curve and the log's tail into the artifact store; history carries only the paths."""
    artifact_dir.mkdir(parents=True, exist_ok=True)
    curve_src = run_dir / CURVE_FILE
    curve_dst = artifact_dir / "memory-curve.csv"
    if curve_src.exists():
        tmp = curve_dst.with_suffix(".tmp")
        with tmp.open("w") as out:
            out.write("unix_time,available_bytes,psi_some_avg10,gpu_used_bytes,gpu_util_pct\n")
            out.write(curve_src.read_text())
        os.replace(tmp, curve_dst)
    tail_dst = artifact_dir / "log-tail.txt"
    text = log_tail(run_dir / LOG_FILE, LOG_TAIL_BYTES)
    tmp = tail_dst.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, tail_dst)
    return (str(curve_dst) if curve_dst.exists() else None, str(tail_dst))
