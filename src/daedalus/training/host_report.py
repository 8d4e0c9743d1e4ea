"""The host's "invisible players": processes and cron jobs that can kill or starve a training run.

In the seed, earlyoom SIGTERMed a run after 2 minutes and a resident watchdog's `swapoff -a` helped. Roots
are parameters so tests read a made-up /proc and /etc from a temp dir.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path

import psutil

from daedalus.schemas.training import HostReport, HostReportInput, InvisiblePlayer
from daedalus.training.memory import Nvml

EARLYOOM_FLAGS = {
    "-m": "min_mem_percent",
    "-s": "min_swap_percent",
    "-M": "min_mem_kib",
    "-S": "min_swap_kib",
    "--prefer": "prefer",
    "--avoid": "avoid",
}
OOMD_KEYS = ("SwapUsedLimit", "DefaultMemoryPressureLimit", "DefaultMemoryPressureDurationSec")


def _cmdline(proc_dir: Path) -> list[str]:
    try:
        raw = (proc_dir / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def earlyoom_thresholds(args: list[str]) -> dict[str, str]:
    """Thresholds from earlyoom's arguments (`-m 10,5`, `-M 2097152`, `--prefer '(^|/)python'`)."""
    found: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        for flag, name in EARLYOOM_FLAGS.items():
            if arg == flag and i + 1 < len(args):
                found[name] = args[i + 1]
                i += 1
                break
            if arg.startswith(flag) and len(arg) > len(flag) and not flag.startswith("--"):
                found[name] = arg[len(flag) :]
                break
            if flag.startswith("--") and arg.startswith(flag + "="):
                found[name] = arg.split("=", 1)[1]
                break
        i += 1
    return found


def oomd_thresholds(etc_root: Path) -> dict[str, str]:
    """systemd-oomd's limits from oomd.conf and its drop-ins (later files win, as systemd reads them)."""
    found: dict[str, str] = {}
    files = [
        etc_root / "systemd" / "oomd.conf",
        *sorted((etc_root / "systemd" / "oomd.conf.d").glob("*.conf")),
    ]
    for path in files:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                key, sep, value = line.strip().partition("=")
                if sep and key.strip() in OOMD_KEYS and value.strip():
                    found[key.strip()] = value.strip()
    return found


def _processes(inp: HostReportInput) -> list[InvisiblePlayer]:
    players: list[InvisiblePlayer] = []
    try:
        pids = [p for p in inp.proc_root.iterdir() if p.name.isdigit()]
    except OSError:
        return players
    for proc_dir in pids:
        args = _cmdline(proc_dir)
        if not args:
            continue
        exe = Path(args[0]).name
        if exe == "earlyoom":
            thresholds = earlyoom_thresholds(args[1:])
            if not thresholds:
                thresholds = _earlyoom_defaults(inp.etc_root)
            players.append(
                InvisiblePlayer(
                    kind="earlyoom",
                    source=f"pid {proc_dir.name}",
                    detail=shlex.join(args),
                    thresholds=thresholds,
                )
            )
        elif exe == "systemd-oomd":
            players.append(
                InvisiblePlayer(
                    kind="systemd-oomd",
                    source=f"pid {proc_dir.name}",
                    detail=shlex.join(args),
                    thresholds=oomd_thresholds(inp.etc_root),
                )
            )
    return players


def _earlyoom_defaults(etc_root: Path) -> dict[str, str]:
    """Debian's /etc/default/earlyoom carries the arguments when the command line has none."""
    with contextlib.suppress(OSError):
        for line in (etc_root / "default" / "earlyoom").read_text().splitlines():
            match = re.match(r'^\s*EARLYOOM_ARGS\s*=\s*"?([^"]*)"?', line)
            if match:
                return earlyoom_thresholds(shlex.split(match.group(1)))
    return {}


def _cron_files(inp: HostReportInput) -> list[Path]:
    files = [inp.etc_root / "crontab"]
    with contextlib.suppress(OSError):
        files += sorted(p for p in (inp.etc_root / "cron.d").iterdir() if p.is_file())
    for root in inp.crontab_roots:
        with contextlib.suppress(OSError):
            files += sorted(p for p in root.iterdir() if p.is_file())
    return files


def _swapoff_crons(inp: HostReportInput) -> list[InvisiblePlayer]:
    players: list[InvisiblePlayer] = []
    for path in _cron_files(inp):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue  # another user's crontab we may not read: not ours to see
        for number, line in enumerate(lines, start=1):
            stripped = line.strip()
            if stripped and not stripped.startswith("#") and re.search(r"\bswapoff\b", stripped):
                players.append(
                    InvisiblePlayer(kind="swapoff-cron", source=f"{path}:{number}", detail=stripped)
                )
    return players


def host_report(inp: HostReportInput) -> HostReport:
    """Everything on the host that may kill a run without being part of it."""
    players = _processes(inp) + _swapoff_crons(inp)
    swap = psutil.swap_memory()
    notes: list[str] = []
    psi = (inp.proc_root / "pressure" / "memory").exists()
    if not psi:
        notes.append("no /proc/pressure/memory: PSI readings are skipped")
    nvml = Nvml()
    if nvml.status == "ok" and nvml.used_bytes() is None:
        notes.append("NVML does not report memory here (unified memory?): host MemAvailable is the reading")
    if swap.total == 0:
        notes.append("no swap: memory pressure goes straight to the OOM killer")
    return HostReport(
        host=inp.host,
        players=players,
        swap_total_bytes=int(swap.total),
        swap_used_bytes=int(swap.used),
        mem_total_bytes=int(psutil.virtual_memory().total),
        psi_available=psi,
        nvml=nvml.status,
        notes=notes,
    )
