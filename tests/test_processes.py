"""Child processes run in their own group, and nothing of the group outlives its step."""

import asyncio
from pathlib import Path

import psutil

from daedalus.processes import group_members, kill_leftover, run_logged


async def test_background_children_do_not_outlive_a_finished_command(tmp_path: Path) -> None:
    pidfile = tmp_path / "step.pid"
    finished = await run_logged(
        "sleep 391 & echo started; echo $$ > leader", cwd=tmp_path, log_path=tmp_path / "log", timeout_s=30,
        pidfile=pidfile,
    )  # fmt: skip
    leader = int((tmp_path / "leader").read_text())
    assert finished.returncode == 0 and "started" in finished.tail()
    assert group_members(leader) == []
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "391"]]
    assert not pidfile.exists()


async def test_a_leftover_group_from_a_dead_worker_is_killed_before_the_rerun(tmp_path: Path) -> None:
    pidfile = tmp_path / "step.pid"
    step = asyncio.create_task(
        run_logged("sleep 392", cwd=tmp_path, log_path=tmp_path / "log", timeout_s=60, pidfile=pidfile)
    )
    while not pidfile.exists():
        await asyncio.sleep(0.05)
    # The worker "dies": its task never finishes, the group stays. A rerun kills it first.
    assert kill_leftover(pidfile) is True
    await asyncio.wait_for(step, 10)
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "392"]]
    assert kill_leftover(pidfile) is False  # nothing recorded any more
