"""The watchdog against a real trainer child process; memory measured on the trainer's own process tree."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

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
from daedalus.training import trainer_keeper as tp
from daedalus.training.checkpoints import complete_checkpoints, prune_checkpoints
from daedalus.training.deaths import classify, oom_evidence
from daedalus.training.incarnation import run_dir_for
from daedalus.training.memory import OomCounters, cgroup_oom_file, kernel_log_oom, read_counter_file
from daedalus.training.supervisor import supervise_segment

TRAINER = Path(__file__).resolve().parents[1] / "fixtures" / "trainer.py"


@pytest.fixture(autouse=True)
def no_trainer_outlives_its_test(tmp_path: Path) -> Iterator[None]:
    """A test that fails half-way leaves its trainer (and keeper) running: kill whatever still runs under its
    directory, so one failure never leaves stray processes on the machine."""
    yield
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(tmp_path) in part for part in proc.info["cmdline"] or []):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


def make_spec(
    tmp: Path, *trainer_args: str, budget_mib: int = 400, stop_at_used_mib: int = 150, **watch: object
) -> TrainingRunSpec:
    """A run whose watchdog stops it once its process tree uses more than `stop_at_used_mib`."""
    policy = {
        "memory_source": MemorySource.PROCESS_TREE,
        "budget_mib": budget_mib,
        "min_available_gib": (budget_mib - stop_at_used_mib) / 1024,
        "sample_interval_s": 0.1,
        "consecutive_samples": 2,
        "slope_window_s": 30,
        "min_fit_span_s": 2,
        "checkpoint_grace_s": 5,
        "term_grace_s": 3,
        "report_interval_s": 30,
        **watch,
    }
    return TrainingRunSpec(
        name="t1",
        host="local",
        command=[sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp / "ckpt"), *trainer_args],
        cwd=tmp,
        checkpoints=CheckpointPolicy(directory=tmp / "ckpt", every_steps=5, keep=2),
        watchdog=WatchdogPolicy.model_validate(policy),
        state_dir=tmp / "state",
        artifact_dir=tmp / "artifacts",
    )


async def segment(
    spec: TrainingRunSpec, incarnation: int = 1, stop: bool = False, filing: str = ""
) -> SegmentReport:
    return await supervise_segment(
        SuperviseInput(spec=spec, incarnation=incarnation, stop_requested=stop, filing=filing),
        state_root=spec.state_dir or Path(),
        artifact_root=spec.artifact_dir or Path(),
        heartbeat=lambda _: None,
    )


async def trainer_record(spec: TrainingRunSpec, incarnation: int = 1) -> tp.TrainerRecord:
    run_dir = run_dir_for(spec.state_dir or Path(), spec, incarnation)
    for _ in range(300):
        record = tp.TrainerRecord.load(run_dir)
        if record is not None:
            return record
        await asyncio.sleep(0.02)
    raise AssertionError("the trainer never started")


def trainers_of(spec: TrainingRunSpec) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if (
            str(TRAINER) in cmd
            and str(spec.checkpoints.directory) in cmd
            and "daedalus.training.trainer_keeper" not in cmd
        ):
            found.append(proc)
    return found


async def test_leak_is_stopped_gracefully_and_a_good_checkpoint_is_kept(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "--mib-per-step", "6", "--step-s", "0.05", "--half-written-every", "3")
    report = await segment(spec)
    death = report.death
    assert death is not None
    assert death.death_class is DeathClass.WATCHDOG_STOP
    assert death.stop_reason is StopReason.THRESHOLD
    assert death.oom_score_adj == 800
    # The checkpoint asked for by SIGUSR1 is complete, is the one reported, and is among the kept two.
    complete = complete_checkpoints(spec.checkpoints)
    assert len(complete) == 2
    assert death.last_checkpoint == str(complete[-1])
    assert (Path(death.last_checkpoint) / "COMPLETE").exists()
    newest = (complete[-1] / "COMPLETE").stat().st_mtime_ns
    for entry in spec.checkpoints.directory.iterdir():
        if not (entry / "COMPLETE").exists():
            assert entry.stat().st_mtime_ns >= newest, (
                f"an abandoned half-written checkpoint was kept: {entry}"
            )
    assert "requested=True" in Path(death.log_tail_path or "").read_text()
    curve = Path(death.curve_path or "").read_text().splitlines()
    assert len(curve) > 3 and curve[0].startswith("unix_time")
    assert not trainers_of(spec)


async def test_flat_run_is_never_stopped_until_asked(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.05", report_interval_s=2.0)
    first = await segment(spec)
    # It sampled all along (how many times in 2 s depends on the machine's load: 7 of 20 were seen at load 13).
    assert first.death is None and first.samples >= 3 and not first.attached
    assert first.memory_now is not None and first.memory_now.available_bytes > spec.watchdog.threshold_bytes
    # The next segment re-attaches to the same trainer: never a second one.
    second = await segment(spec)
    assert second.death is None and second.attached and second.trainer_pid == first.trainer_pid
    assert len(trainers_of(spec)) == 1
    stopped = await segment(spec, stop=True)
    assert stopped.death is not None
    assert stopped.death.death_class is DeathClass.REQUESTED_STOP
    assert not trainers_of(spec)


@pytest.mark.parametrize(
    ("sig", "expected"),
    [(signal.SIGKILL, DeathClass.OUTSIDE_SIGKILL), (signal.SIGTERM, DeathClass.OUTSIDE_SIGTERM)],
)
async def test_outside_signal_is_classified(
    tmp_path: Path, sig: signal.Signals, expected: DeathClass
) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.05")
    task = asyncio.create_task(segment(spec))
    record = await trainer_record(spec)
    await asyncio.sleep(0.3)
    os.kill(record.pid, sig)
    report = await task
    assert report.death is not None
    assert report.death.death_class is expected
    assert report.death.signal == sig.name
    assert report.death.stop_reason is None
    # A retried call reports the same death, does not start the trainer again.
    again = await segment(spec)
    assert again.death == report.death
    assert not trainers_of(spec)


async def test_crash_keeps_its_exit_code_and_log(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.02", "--exit-code-at-step", "5", "3")
    report = await segment(spec)
    assert report.death is not None
    assert report.death.death_class is DeathClass.CRASH
    assert report.death.exit_code == 3
    assert "crashing at step 5" in Path(report.death.log_tail_path or "").read_text()


async def test_clean_exit(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.02", "--steps", "12")
    report = await segment(spec)
    assert report.death is not None and report.death.death_class is DeathClass.CLEAN_EXIT


async def test_a_run_started_again_launches_afresh_instead_of_reporting_the_old_death(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.02", "--exit-code-at-step", "5", "3")
    first = await segment(spec, filing="first-start")
    assert first.death is not None and first.death.death_class is DeathClass.CRASH
    again = await segment(spec, filing="second-start")
    # The second start launched its own trainer instead of attaching to the first start's recorded end.
    assert again.death is not None and not again.attached and again.trainer_pid != first.trainer_pid
    assert "second-start" in (again.death.log_tail_path or "")


async def test_missing_command_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    spec = make_spec(tmp_path).model_copy(update={"command": ["no-such-trainer-xyz", "--go"]})
    with pytest.raises(TrainingInputError, match=r"no-such-trainer-xyz.*not on PATH"):
        await segment(spec)
    run_dir = run_dir_for(tmp_path / "state", spec, 1)
    assert not (run_dir / tp.INTENT_FILE).exists()
    assert not (run_dir / tp.TRAINER_FILE).exists()


async def test_unwritable_checkpoint_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    spec = make_spec(tmp_path)
    spec = spec.model_copy(update={"checkpoints": CheckpointPolicy(directory=blocker / "ckpt", keep=2)})
    with pytest.raises(TrainingInputError, match=r"checkpoint directory .* is not writable"):
        await segment(spec)
    assert not trainers_of(spec)


def test_impossible_policies_are_refused() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        CheckpointPolicy(directory=Path("/tmp/x"), keep=0)
    with pytest.raises(ValidationError, match="needs budget_mib"):
        WatchdogPolicy(memory_source=MemorySource.PROCESS_TREE)
    with pytest.raises(ValidationError, match="would be stopped at once"):
        WatchdogPolicy(memory_source=MemorySource.PROCESS_TREE, budget_mib=1024, min_available_gib=2)
    with pytest.raises(ValidationError, match="unknown signal"):
        WatchdogPolicy(checkpoint_signal="SIGNOPE")


async def test_threshold_above_total_memory_is_refused(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    huge = spec.watchdog.model_copy(
        update={"memory_source": MemorySource.HOST, "budget_mib": None, "min_available_gib": 10_000.0}
    )
    with pytest.raises(TrainingInputError, match="above this host's total memory"):
        await segment(spec.model_copy(update={"watchdog": huge}))


def test_prune_keeps_latest_complete_and_never_a_half_written_one(tmp_path: Path) -> None:
    policy = CheckpointPolicy(directory=tmp_path, keep=2)
    names = ["c1", "c2", "h3", "c4", "c5", "h6"]  # h = half-written (no marker)
    for i, name in enumerate(names):
        path = tmp_path / name
        path.mkdir()
        (path / "state.json").write_text("{}")
        if name.startswith("c"):
            (path / "COMPLETE").write_text("")
        stamp = 1_000_000_000 + i
        for target in (path, path / "COMPLETE", path / "state.json"):
            if target.exists():
                os.utime(target, (stamp, stamp))
    removed = {p.name for p in prune_checkpoints(policy)}
    assert removed == {"c1", "c2", "h3"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c4", "c5", "h6"]
    assert [p.name for p in complete_checkpoints(policy)] == ["c4", "c5"]


def test_classify_table() -> None:
    assert classify(-9, None)[0] is DeathClass.OUTSIDE_SIGKILL
    assert classify(137, None)[0] is DeathClass.OUTSIDE_SIGKILL
    assert classify(-9, None, oom=["/proc/vmstat oom_kill +1"])[0] is DeathClass.KERNEL_OOM
    assert classify(-15, None)[0] is DeathClass.OUTSIDE_SIGTERM
    assert classify(-2, None)[0] is DeathClass.OUTSIDE_SIGNAL
    assert classify(-9, StopReason.THRESHOLD)[0] is DeathClass.WATCHDOG_STOP
    assert classify(0, StopReason.REQUESTED)[0] is DeathClass.REQUESTED_STOP
    assert classify(0, None)[0] is DeathClass.CLEAN_EXIT
    assert classify(2, None)[:2] == (DeathClass.CRASH, None)
    assert classify(None, None)[0] is DeathClass.LOST


# Deaths on evidence: a SIGKILL is a kernel OOM only when the kernel says so.

KMSG = (
    "6,2101,5123456789,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    "oom_memcg=/train,task_memcg=/train,task=python,pid={pid},uid=0\n"
    "3,2102,5123456790,-;Memory cgroup out of memory: Killed process {pid} (python) total-vm:127002340kB, "
    "anon-rss:120232012kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:235616kB oom_score_adj:800\n"
)


def test_memory_cgroup_oom_counters_are_found_for_v1_and_v2(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "41").mkdir(parents=True)
    (proc / "41" / "cgroup").write_text("12:pids:/train\n4:memory:/train\n0::/train\n")
    (root / "memory" / "train").mkdir(parents=True)
    (root / "memory" / "train" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
    )
    v1 = cgroup_oom_file(41, proc, root)
    assert v1 == root / "memory" / "train" / "memory.oom_control" and read_counter_file(v1) == 2
    (proc / "42").mkdir()
    (proc / "42" / "cgroup").write_text("0::/system.slice/train.service\n")
    (root / "system.slice" / "train.service").mkdir(parents=True)
    events = root / "system.slice" / "train.service" / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert cgroup_oom_file(42, proc, root) == events and read_counter_file(events) == 1
    assert cgroup_oom_file(43, proc, root) is None


async def test_a_real_sigkill_is_a_kernel_oom_only_with_evidence(tmp_path: Path) -> None:
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    os.kill(child.pid, signal.SIGKILL)
    returncode = await child.wait()
    assert returncode == -signal.SIGKILL
    before = OomCounters(vmstat=7, cgroup=0, cgroup_file="/sys/fs/cgroup/train/memory.events")
    # Nothing moved and the kernel log does not name the child: someone outside sent it.
    evidence, delta = oom_evidence(before, before, None)
    cls, sig, summary = classify(returncode, None, None, evidence)
    assert (cls, sig, delta) == (DeathClass.OUTSIDE_SIGKILL, "SIGKILL", 0) and "sender unknown" in summary
    # The kernel's log names the child: a kernel OOM, and the summary says why.
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(KMSG.format(pid=child.pid))
    line = kernel_log_oom(child.pid, kmsg)
    assert line is not None and f"Killed process {child.pid} (python)" in line
    assert kernel_log_oom(child.pid + 1, kmsg) is None
    evidence, _ = oom_evidence(before, before, line)
    cls, _, summary = classify(returncode, None, None, evidence)
    assert cls is DeathClass.KERNEL_OOM and f"Killed process {child.pid}" in summary
    # The memory cgroup's own counter moved: evidence too; a host-wide move alone is weaker but still counts.
    after = OomCounters(vmstat=7, cgroup=1, cgroup_file=before.cgroup_file)
    assert "the trainer's memory cgroup" in oom_evidence(before, after, None)[0][0]
    host = OomCounters(vmstat=8, cgroup=0, cgroup_file=before.cgroup_file)
    assert oom_evidence(before, host, None) == (["/proc/vmstat oom_kill +1 during the run (host-wide)"], 1)


async def test_supervised_outside_sigkill_records_no_oom_evidence(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "--step-s", "0.05")
    task = asyncio.create_task(segment(spec))
    record = await trainer_record(spec)
    await asyncio.sleep(0.3)
    os.kill(record.pid, signal.SIGKILL)
    report = await task
    assert report.death is not None
    if not report.death.oom_kills_during_run:  # the watchdog saw no OOM kill anywhere on the host meanwhile
        assert report.death.death_class is DeathClass.OUTSIDE_SIGKILL and report.death.oom_evidence == []
        assert "sender unknown" in report.death.summary
    else:
        # Another process on this shared host was OOM-killed meanwhile (a test of memory limits): a host-wide
        # move is the only evidence a unified-memory host has, so it counts, and says it is host-wide.
        assert report.death.death_class is DeathClass.KERNEL_OOM, report.death
        assert [line for line in report.death.oom_evidence if "host-wide" in line], report.death.oom_evidence
