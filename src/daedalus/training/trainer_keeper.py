"""Start a trainer so that it outlives its supervisor, and find it again after the supervisor restarts.

The trainer runs under a tiny keeper (`python -m daedalus.training.trainer_keeper`), in a session of its own.
The keeper sets oom_score_adj before the trainer executes, records pid + create_time in `trainer.json`, waits,
and writes the exit status to `exit.json`: the watchdog is not the trainer's parent after a restart, so the
keeper is what remembers how it died. The trainer has its own process group, so a stop can kill all of it
without killing the keeper.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil

from daedalus.errors import TrainingInputError

TRAINER_FILE = "trainer.json"
EXIT_FILE = "exit.json"
INTENT_FILE = "launch.intent"
LOG_FILE = "trainer.log"
KEEPER_LOG = "keeper.log"
ENV_MARKER = "DAEDALUS_TRAINING_INCARNATION"

_keepers: dict[int, subprocess.Popen[bytes]] = {}
"""Keepers this process started, so it can reap them (no zombies in a long-lived worker)."""


def write_json_atomic(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class TrainerRecord:
    pid: int
    create_time: float
    pgid: int
    keeper_pid: int
    started_at: datetime
    oom_score_adj: int | None

    @classmethod
    def load(cls, run_dir: Path) -> TrainerRecord | None:
        data = read_json(run_dir / TRAINER_FILE)
        if data is None:
            return None
        adj = data.get("oom_score_adj")
        return cls(
            pid=int(str(data["pid"])),
            create_time=float(str(data["create_time"])),
            pgid=int(str(data["pgid"])),
            keeper_pid=int(str(data["keeper_pid"])),
            started_at=datetime.fromisoformat(str(data["started_at"])),
            oom_score_adj=None if adj is None else int(str(adj)),
        )

    def is_alive(self) -> bool:
        """True while the recorded trainer runs; a recycled pid with another create_time is not ours."""
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.create_time) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


@dataclass(frozen=True)
class ExitRecord:
    returncode: int
    ended_at: datetime
    error: str | None

    @classmethod
    def load(cls, run_dir: Path) -> ExitRecord | None:
        data = read_json(run_dir / EXIT_FILE)
        if data is None:
            return None
        err = data.get("error")
        return cls(
            returncode=int(str(data["returncode"])),
            ended_at=datetime.fromisoformat(str(data["ended_at"])),
            error=None if err is None else str(err),
        )


def resolve_command(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    """The executable `command[0]` names, or a TrainingInputError that says why it cannot run."""
    exe = command[0]
    if os.sep in exe:
        path = (cwd / exe) if not os.path.isabs(exe) else Path(exe)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise TrainingInputError(
                f"the trainer command {exe!r} is not an executable file (looked at {path})"
            )
        return str(path)
    found = shutil.which(exe, path=env.get("PATH", os.environ.get("PATH", "")))
    if found is None:
        raise TrainingInputError(
            f"the trainer command {exe!r} is not on PATH; give an absolute path or fix PATH"
        )
    return found


def check_writable_dir(path: Path, what: str) -> None:
    """Create `path` if needed and prove it writable, or raise TrainingInputError naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".daedalus-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise TrainingInputError(
            f"the {what} {path} is not writable ({exc.strerror}); fix its permissions"
        ) from exc


def launch(
    run_dir: Path,
    command: list[str],
    cwd: Path,
    env: dict[str, str],
    oom_score_adj: int,
    marker: str,
    cgroup_procs: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start the keeper, detached from this process's session. The caller must hold the run dir's lock. With
    `cgroup_procs`, the keeper moves the trainer into that cgroup before it executes (the keeper stays out)."""
    full_env = {**os.environ, **env, ENV_MARKER: marker}
    cgroup = ["--cgroup-procs", str(cgroup_procs)] if cgroup_procs is not None else []
    keeper_log = (run_dir / KEEPER_LOG).open("ab")
    try:
        keeper = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daedalus.training.trainer_keeper",
                "--dir",
                str(run_dir),
                "--oom-score-adj",
                str(oom_score_adj),
                *cgroup,
                "--",
                *command,
            ],
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=keeper_log,
            stderr=keeper_log,
            start_new_session=True,
        )
    finally:
        keeper_log.close()
    _keepers[keeper.pid] = keeper
    return keeper


def reap_keepers() -> None:
    for pid, keeper in list(_keepers.items()):
        if keeper.poll() is not None:
            del _keepers[pid]


def wait_for_record(run_dir: Path, timeout_s: float) -> TrainerRecord | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = TrainerRecord.load(run_dir)
        if record is not None or (run_dir / EXIT_FILE).exists():
            return record
        time.sleep(0.02)
    return None


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def signal_pid(record: TrainerRecord, sig: signal.Signals) -> bool:
    if not record.is_alive():
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, sig)
        return True
    return False


def _set_oom_score_adj(value: int) -> None:
    # Raising the score needs no privilege; lowering it does. A refusal is recorded, not fatal.
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as handle:
        handle.write(str(value))


def _before_exec(adj: int, cgroup_procs: Path | None) -> None:
    """In the trainer's process, before it executes: its OOM score, and its own memory cgroup. A cgroup that
    refuses it fails the start (recorded as such): the run's memory limit is a promise, not a wish."""
    _set_oom_score_adj(adj)
    if cgroup_procs is not None:
        with open(cgroup_procs, "w") as handle:
            handle.write(str(os.getpid()))


def _read_oom_score_adj(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/oom_score_adj").read_text())
    except (OSError, ValueError):
        return None


def keeper_main(argv: list[str] | None = None) -> int:
    """The keeper: start the trainer in its own group, record it, wait, record how it ended."""
    parser = argparse.ArgumentParser(prog="daedalus-trainer-keeper")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--oom-score-adj", type=int, required=True)
    parser.add_argument("--cgroup-procs", type=Path, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = [c for c in args.command if c != "--"] if args.command[:1] == ["--"] else args.command
    run_dir: Path = args.dir
    # The keeper must not die with its session's terminal or with a stray SIGTERM meant for the trainer.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    adj = args.oom_score_adj
    cgroup_procs: Path | None = args.cgroup_procs
    with (run_dir / LOG_FILE).open("ab") as log:
        try:
            trainer = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: _before_exec(adj, cgroup_procs),  # the keeper is single-threaded: safe
            )
        except (OSError, subprocess.SubprocessError) as exc:
            write_json_atomic(
                run_dir / EXIT_FILE,
                {"returncode": 127, "ended_at": datetime.now(UTC).isoformat(), "error": str(exc)},
            )
            return 127
    try:
        create_time = psutil.Process(trainer.pid).create_time()
    except psutil.Error:
        create_time = 0.0
    write_json_atomic(
        run_dir / TRAINER_FILE,
        {
            "pid": trainer.pid,
            "create_time": create_time,
            "pgid": trainer.pid,
            "keeper_pid": os.getpid(),
            "started_at": datetime.now(UTC).isoformat(),
            "oom_score_adj": _read_oom_score_adj(trainer.pid),
        },
    )
    returncode = trainer.wait()
    write_json_atomic(
        run_dir / EXIT_FILE,
        {"returncode": returncode, "ended_at": datetime.now(UTC).isoformat(), "error": None},
    )
    return 0


if __name__ == "__main__":
    sys.exit(keeper_main())
