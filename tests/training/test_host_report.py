"""The host report against a made-up /proc and /etc in a temp dir."""

from __future__ import annotations

from pathlib import Path

from daedalus.schemas.training import HostReportInput
from daedalus.training.host_report import earlyoom_thresholds, host_report


def fake_proc(root: Path, pid: int, *args: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")


def test_finds_the_seeds_invisible_players(tmp_path: Path) -> None:
    proc, etc, spool = tmp_path / "proc", tmp_path / "etc", tmp_path / "spool"
    fake_proc(proc, 412, "/usr/bin/earlyoom", "-m", "10,5", "-s", "100", "--prefer", "(^|/)python")
    fake_proc(proc, 77, "/usr/lib/systemd/systemd-oomd")
    fake_proc(proc, 1, "/sbin/init")
    (proc / "self").mkdir()  # not a pid: skipped
    (proc / "pressure").mkdir()
    (proc / "pressure" / "memory").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    (etc / "systemd" / "oomd.conf.d").mkdir(parents=True)
    (etc / "systemd" / "oomd.conf").write_text("[OOM]\nSwapUsedLimit=90%\nDefaultMemoryPressureLimit=60%\n")
    (etc / "systemd" / "oomd.conf.d" / "10-site.conf").write_text("[OOM]\nDefaultMemoryPressureLimit=50%\n")
    (etc / "crontab").write_text("# m h dom mon dow user command\n# */5 * * * * root swapoff -a\n")
    (etc / "cron.d").mkdir()
    (etc / "cron.d" / "gb10-guard").write_text(
        "*/10 * * * * root /usr/sbin/swapoff -a && /usr/sbin/swapon -a\n"
    )
    spool.mkdir()
    (spool / "wayne").write_text("0 3 * * * /home/wayne/bin/backup.sh\n@reboot swapoff -a\n")

    report = host_report(HostReportInput(host="gb10", proc_root=proc, etc_root=etc, crontab_roots=[spool]))

    by_kind = {p.kind: [] for p in report.players}
    for player in report.players:
        by_kind[player.kind].append(player)
    (earlyoom,) = by_kind["earlyoom"]
    assert earlyoom.source == "pid 412"
    assert earlyoom.thresholds == {
        "min_mem_percent": "10,5",
        "min_swap_percent": "100",
        "prefer": "(^|/)python",
    }
    (oomd,) = by_kind["systemd-oomd"]
    assert oomd.thresholds == {"SwapUsedLimit": "90%", "DefaultMemoryPressureLimit": "50%"}
    crons = sorted(p.source for p in by_kind["swapoff-cron"])
    assert crons == [f"{etc / 'cron.d' / 'gb10-guard'}:1", f"{spool / 'wayne'}:2"]  # the commented one is not
    assert report.psi_available
    assert "earlyoom (pid 412)" in report.summary()


def test_earlyoom_defaults_file_and_joined_flags(tmp_path: Path) -> None:
    proc, etc = tmp_path / "proc", tmp_path / "etc"
    fake_proc(proc, 9, "earlyoom")
    (etc / "default").mkdir(parents=True)
    (etc / "default" / "earlyoom").write_text('EARLYOOM_ARGS="-m 5 -M 2097152 -r 3600"\n')
    report = host_report(HostReportInput(host="h", proc_root=proc, etc_root=etc, crontab_roots=[]))
    assert report.players[0].thresholds == {"min_mem_percent": "5", "min_mem_kib": "2097152"}
    assert earlyoom_thresholds(["-m10", "--avoid=sshd"]) == {"min_mem_percent": "10", "avoid": "sshd"}


def test_empty_or_missing_roots_report_nothing_and_do_not_crash(tmp_path: Path) -> None:
    report = host_report(
        HostReportInput(
            host="h", proc_root=tmp_path / "nope", etc_root=tmp_path / "nope", crontab_roots=[tmp_path]
        )
    )
    assert report.players == []
    assert not report.psi_available
    assert any("PSI" in note for note in report.notes)
    assert report.mem_total_bytes > 0
