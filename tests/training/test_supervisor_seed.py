"""The watchdog of the seed's train8, against real child processes and real kernel memory: a fast spike stopped
by the kernel's notification before the OOM killer acts, the same spike killed by the kernel when the watchdog
only polls, the trainer's progress and ETA, and checkpoints the workflow still needs kept from pruning.

The spikes run in a memory cgroup of their own (cgroup v1's memory controller, writable by root here) limited
to 1 GiB, so the shared machine never feels them; without such a cgroup those tests skip and say why."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from daedalus.errors import TrainingInputError
from daedalus.schemas.training import (
    CheckpointPolicy,
    DeathClass,
    MemorySource,
    SegmentReport,
    StopReason,
    SuperviseInput,
    TrainingRunSpec,
    WatchdogPolicy,
)
from daedalus.training.checkpoints import complete_checkpoints
from daedalus.training.incarnation import run_dir_for
from daedalus.training.memory import TrainerCgroup
from daedalus.training.memory_events import MemoryEvents
from daedalus.training.supervisor import supervise_segment
from daedalus.training.waker import arm_events

TRAINER = Path(__file__).resolve().parents[1] / "fixtures" / "trainer.py"
GIB = 1024**3
LIMIT_MIB = 1024
HEADROOM_GIB = 0.375
"""Stop once the trainer's cgroup holds more than 640 MiB of its 1 GiB."""


@pytest.fixture(autouse=True)
def no_trainer_outlives_its_test(tmp_path: Path) -> Iterator[None]:
    yield
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(tmp_path) in part for part in proc.info["cmdline"] or []):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


@pytest.fixture(scope="module")
def memory_cgroups() -> None:
    try:
        TrainerCgroup.make("probe", 64 * 1024 * 1024).remove()
    except TrainingInputError as error:
        pytest.skip(f"no memory cgroup for a trainer here: {error}")


def spike_spec(tmp: Path, *, events: bool, interval_s: float = 30.0) -> TrainingRunSpec:
    """A trainer that idles 1 s, then allocates 2 GiB/s (as fast as this machine faults pages, if slower) until
    the watchdog stops it or its 1 GiB cgroup's OOM killer does. The samples on the interval come at the
    segment's start and 30 s later, the spike in between: only a kernel notification can stop it in time."""
    return TrainingRunSpec(
        name="spike",
        host="local",
        command=[
            sys.executable,
            str(TRAINER),
            "--checkpoint-dir",
            str(tmp / "ckpt"),
            "--step-s",
            "0.1",
            "--spike-gib-per-s",
            "2",
            "--spike-after-s",
            "1",
            "--max-mib",
            "2048",
        ],
        cwd=tmp,
        checkpoints=CheckpointPolicy(directory=tmp / "ckpt", every_steps=1000, keep=2),
        watchdog=WatchdogPolicy(
            memory_source=MemorySource.CGROUP,
            memory_limit_mib=LIMIT_MIB,
            min_available_gib=HEADROOM_GIB,
            memory_events=events,
            sample_interval_s=interval_s,
            consecutive_samples=2,
            confirm_interval_s=0.05,
            slope_window_s=60,
            min_fit_span_s=10,
            checkpoint_grace_s=5,
            term_grace_s=3,
            report_interval_s=40,
        ),
        state_dir=tmp / "state",
        artifact_dir=tmp / "artifacts",
    )


async def segment(spec: TrainingRunSpec, keep: list[str] | None = None) -> SegmentReport:
    return await supervise_segment(
        SuperviseInput(spec=spec, incarnation=1, keep=keep or []),
        state_root=spec.state_dir or Path(),
        artifact_root=spec.artifact_dir or Path(),
        heartbeat=lambda _: None,
    )


def cgroup_lines(evidence: list[str]) -> list[str]:
    return [line for line in evidence if "the trainer's memory cgroup" in line]


@pytest.mark.timeout(120)
async def test_seed_a_2gib_per_s_spike_is_stopped_gracefully_before_the_oom_killer(
    tmp_path: Path, memory_cgroups: None
) -> None:
    spec = spike_spec(tmp_path, events=True)
    report = await segment(spec)
    death = report.death
    assert death is not None, report
    assert report.wakeups is not None and "cgroup v1 usage threshold" in report.wakeups
    # Our graceful stop, begun by the kernel's notification (not a sample on the interval) ...
    assert death.death_class is DeathClass.WATCHDOG_STOP, death.summary
    assert death.stop_reason is StopReason.THRESHOLD
    assert death.stop_trigger is not None and death.stop_trigger.startswith(
        "woken by cgroup v1 usage threshold"
    )
    # ... with the checkpoint it asked for complete, and no OOM kill in the trainer's cgroup.
    assert death.last_checkpoint is not None and (Path(death.last_checkpoint) / "COMPLETE").is_file()
    log = Path(death.log_tail_path or "").read_text()
    assert "requested=True" in log and "spike start at=" in log
    assert not cgroup_lines(death.oom_evidence), death.oom_evidence
    assert death.cgroup_peak_bytes is not None and death.cgroup_peak_bytes < LIMIT_MIB * 1024 * 1024
    assert death.cgroup_peak_bytes > (LIMIT_MIB / 1024 - HEADROOM_GIB) * GIB  # it did cross the threshold
    assert [str(p) for p in complete_checkpoints(spec.checkpoints)] == [death.last_checkpoint]


@pytest.mark.timeout(120)
async def test_seed_the_same_spike_with_polling_only_is_killed_by_the_kernel(
    tmp_path: Path, memory_cgroups: None
) -> None:
    """What the notification buys: sampling every 30 s, the watchdog never sees the spike before the OOM killer
    of the trainer's own cgroup acts, and the death is classified from that cgroup's counter."""
    spec = spike_spec(tmp_path, events=False)
    report = await segment(spec)
    death = report.death
    assert death is not None
    assert report.wakeups is not None and report.wakeups.startswith("polling")
    assert "memory_events is off" in report.wakeups
    assert death.death_class is DeathClass.KERNEL_OOM, death.summary
    assert cgroup_lines(death.oom_evidence), death.oom_evidence
    assert death.stop_reason is None


async def test_seed_progress_throughput_and_eta_from_the_trainers_steps(tmp_path: Path) -> None:
    spec = TrainingRunSpec(
        name="progress",
        host="local",
        command=[sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp_path / "ckpt"), "--step-s", "0.1"],
        cwd=tmp_path,
        checkpoints=CheckpointPolicy(directory=tmp_path / "ckpt", every_steps=5, keep=2),
        watchdog=WatchdogPolicy(
            memory_source=MemorySource.PROCESS_TREE,
            budget_mib=400,
            min_available_gib=0.2,
            sample_interval_s=0.2,
            report_interval_s=4,
        ),
        target_steps=400,
        progress_window_s=30,
        state_dir=tmp_path / "state",
        artifact_dir=tmp_path / "artifacts",
    )
    first = await segment(spec)
    assert first.death is None and first.progress is not None
    run_dir = run_dir_for(tmp_path / "state", spec, 1)
    seen_first = len((run_dir / "progress.csv").read_text().splitlines())
    second = await segment(spec)  # re-attached: the window carries over from the progress log
    progress = second.progress
    assert progress is not None and progress.target_steps == 400 and progress.step >= 30
    # The window reaches back into the first segment: the re-attached watchdog read the log its predecessor kept.
    log = [line.split(",") for line in (run_dir / "progress.csv").read_text().splitlines()]
    assert seen_first >= 3 and len(log) > seen_first
    assert progress.window_s == pytest.approx(float(log[-1][0]) - float(log[0][0]), abs=0.01)
    # 0.1 s a step plus the trainer's own time: between 2 and 10 steps/s whatever the load.
    assert progress.steps_per_s is not None and 2 <= progress.steps_per_s <= 10
    assert progress.eta_s is not None
    assert progress.eta_s == pytest.approx((400 - progress.step) / progress.steps_per_s)
    assert "step" in progress.summary() and "ETA" in progress.summary()
    stopped = await supervise_segment(
        SuperviseInput(spec=spec, incarnation=1, stop_requested=True),
        state_root=tmp_path / "state",
        artifact_root=tmp_path / "artifacts",
        heartbeat=lambda _: None,
    )
    assert stopped.death is not None and stopped.death.progress is not None
    assert stopped.death.progress.step >= progress.step


async def test_seed_checkpoints_the_workflow_still_needs_are_never_pruned(tmp_path: Path) -> None:
    spec = TrainingRunSpec(
        name="keep",
        host="local",
        command=[
            sys.executable,
            str(TRAINER),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--step-s",
            "0.02",
        ],
        cwd=tmp_path,
        checkpoints=CheckpointPolicy(directory=tmp_path / "ckpt", every_steps=5, keep=2),
        watchdog=WatchdogPolicy(
            memory_source=MemorySource.PROCESS_TREE,
            budget_mib=400,
            min_available_gib=0.2,
            sample_interval_s=0.1,
            report_interval_s=3,
        ),
        state_dir=tmp_path / "state",
        artifact_dir=tmp_path / "artifacts",
    )
    needed = str(tmp_path / "ckpt" / "ckpt-0000005")
    pruned: list[str] = []
    for _ in range(10):  # segments of 3 s until the trainer is past step 30, however slow its start today
        report = await segment(spec, keep=[needed])
        assert report.death is None
        pruned += report.checkpoints_pruned
        if report.progress is not None and report.progress.step >= 30:
            break
    names = [Path(path).name for path in report.checkpoints]
    # The needed one stays, beside the latest two (and one the trainer may have written after the last prune);
    # everything between was pruned.
    assert names[0] == "ckpt-0000005" and 3 <= len(names) <= 4, names
    assert int(names[1].removeprefix("ckpt-")) >= 15, names
    assert (Path(needed) / "COMPLETE").is_file()
    assert any("ckpt-0000010" in path for path in pruned)
    await supervise_segment(
        SuperviseInput(spec=spec, incarnation=1, stop_requested=True),
        state_root=tmp_path / "state",
        artifact_root=tmp_path / "artifacts",
        heartbeat=lambda _: None,
    )


def test_seed_a_psi_trigger_is_armed_as_the_kernel_allows_or_refused_with_its_reason(tmp_path: Path) -> None:
    """As written where the worker may (CAP_SYS_RESOURCE), scaled to a 2 s window where it may not, and a
    file that takes no trigger is named with the kernel's reason."""
    with MemoryEvents() as events:
        assert not events.add_psi(tmp_path / "missing", "some 150000 1000000", "(nowhere)")
        assert "cannot open it" in events.refused[0]
    psi = Path("/proc/pressure/memory")
    if not psi.exists():
        pytest.skip("this kernel has no PSI")
    policy = WatchdogPolicy()  # host MemAvailable: the PSI trigger is its notification
    events = arm_events(policy, None)
    try:
        description = events.describe(policy.sample_interval_s)
        if events.armed:
            assert "PSI (host-wide)" in description
            assert "'some 150000 1000000'" in description or "'some 300000 2000000'" in description
        else:
            assert description.startswith("polling") and "PSI trigger" in description
    finally:
        events.close()
