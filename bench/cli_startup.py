"""How long a decider waits for the CLI: each command a decider runs, as a real child process, against a stack.

Starts `daedalus up` as a child process (its own home, Temporal port and UI port under a temporary directory), files
one ticket that parks awaiting dispatch approval, then runs each of

    daedalus decide --help, daedalus ticket list, daedalus ticket show <id>, daedalus hosts, daedalus audit --help

N times (interleaved: one round runs each command once), each through the installed `daedalus` entry point, as a
person types it. For each: the median and max wall time, and the median user+sys CPU the child and its children
used (getrusage of reaped children, read around each run). A command's wall time includes the interpreter's own
start (`python -c pass`, measured alongside) and, for `ticket show` and `hosts`, the round trips to Temporal.

Beside each command: the import time of its module alone (`python -X importtime -c "import daedalus.cli.<m>"`,
the cumulative microseconds Python reports for that module, median of the rounds), and the heaviest modules it
pulls in, so a regression names its cause.

Goal: under 1 s wall (median) for each command. The stack runs during the measurement, as it does for a decider:
its workers share the machine's cores with the CLI.

With --baseline COMMIT, each round also runs the same commands from that commit's code (its src/ from `git
archive`, first on the children's PYTHONPATH) against the same stack, the two trees alternating which goes first:
before and after a change, measured under the same load. Its figures are under `baseline`.

Results: bench/results/cli_startup.json (bench/record.py: the commit, the machine, its load before and during).
Run: .venv/bin/python bench/cli_startup.py [--rounds 7] [--baseline COMMIT] [--results PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from record import RESULTS, Recording  # bench/record.py: this script's directory is first on sys.path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from daedalus.ports import free_port  # noqa: E402

GOAL_S = 1.0
"""A decider clearing a queue pays a command's start-up per decision: under a second each."""
VENV_BIN = Path(sys.executable).parent
DAEDALUS = VENV_BIN / "daedalus"
TICKET_ID = "bench-startup-1"
UP_TIMEOUT_S = 180.0

COMMANDS: dict[str, tuple[list[str], str]] = {
    "decide --help": (["decide", "--help"], "decisions"),
    "ticket list": (["ticket", "list"], "tickets"),
    "ticket show": (["ticket", "show", TICKET_ID], "tickets"),
    "hosts": (["hosts"], "hosts"),
    "audit --help": (["audit", "--help"], "audit"),
}
"""Shown name -> (arguments, the CLI module that command imports: daedalus.cli.<module>)."""

SPEC = """\
id: {ticket_id}
title: "CLI start-up bench: a ticket parked awaiting dispatch approval"
kind: fix
engine: {{name: toy, kind: llama_cpp, repo: {repo}, base_commit: main}}
host: local
agent: {{name: scripted, commands: ["true"]}}
spec: Nothing runs; the ticket waits for a decision while the CLI is timed.
build: {{command: "true"}}
gates:
  - {{name: noop, metric: decode_tps, threshold: 1, command: "true"}}
approval: {{deciders: [wayne]}}
max_attempts: 1
"""


def children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(
    argv: list[str], env: dict[str, str], cwd: Path
) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """(wall s, user+sys CPU s, the finished process) of one command, run to its end."""
    cpu, started = children_cpu(), time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    return time.perf_counter() - started, children_cpu() - cpu, done


def import_time(module: str, env: dict[str, str], cwd: Path) -> tuple[float, list[tuple[str, float]]]:
    """(the module's cumulative import seconds, the five heaviest modules under it with theirs)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        found = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if found:
            rows.append((found[4], int(found[2]) / 1e6, len(found[3])))
    total = next(seconds for name, seconds, _ in rows if name == module)
    heavy = sorted(
        ((name, seconds) for name, seconds, depth in rows if name.startswith("daedalus") and name != module),
        key=lambda row: -row[1],
    )
    top = [row for row in heavy if not row[0].startswith("daedalus.cli")][:5]
    return total, top


def wait_for_up(process: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"`daedalus up` ended with {process.returncode}:\n{log.read_text()[-3000:]}")
        if "Temporal at" in log.read_text():
            return
        time.sleep(0.2)
    raise SystemExit(f"`daedalus up` did not start within {UP_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}")


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README").write_text("toy engine\n")
    for command in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-q", "-m", "base"],
    ):
        subprocess.run(command, cwd=path, check=True)
    return path


def checkout(commit: str, where: Path) -> tuple[str, Path]:
    """(the full sha, its src/ directory): `commit`'s package, put first on a child's PYTHONPATH."""
    found = subprocess.run(
        ["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if found.returncode != 0:
        raise SystemExit(f"--baseline {commit}: not a commit of this repository ({found.stderr.strip()})")
    sha = found.stdout.strip()
    where.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", sha, "src", "examples"], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return sha, where / "src"


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "max": round(max(values), 4)}


def measure(rounds: int, work: Path, baseline: Path | None, baseline_commit: str | None) -> dict[str, Any]:
    home = work / ".daedalus"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("DAEDALUS_") or key == "DAEDALUS_CACHE_DIR"
    }
    env.update(
        DAEDALUS_HOME=str(home),
        DAEDALUS_TEMPORAL_PORT=str(free_port()),
        DAEDALUS_TEMPORAL_UI_PORT=str(free_port()),
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    log = work / "up.log"
    with log.open("w") as out:
        up = subprocess.Popen(
            [str(DAEDALUS), "up"], env=env, cwd=work, stdout=out, stderr=subprocess.STDOUT, text=True
        )
    try:
        wait_for_up(up, log)
        spec = work / "ticket.yaml"
        spec.write_text(SPEC.format(ticket_id=TICKET_ID, repo=make_repo(work / "repo")))
        filed = subprocess.run(
            [str(DAEDALUS), "ticket", "create", "-f", str(spec)],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
        )
        if filed.returncode != 0:
            raise SystemExit(f"filing the ticket failed:\n{filed.stdout}{filed.stderr}")
        python_walls: list[float] = []
        python_cpus: list[float] = []
        deadline = time.monotonic() + 60
        while True:  # parked: its first decision request is written
            _, _, shown = timed([str(DAEDALUS), "ticket", "show", TICKET_ID], env, work)
            if shown.returncode == 0 and "awaiting" in shown.stdout.lower():
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the ticket did not park:\n{shown.stdout}{shown.stderr}")
            time.sleep(0.5)

        trees = {"current": env}
        if baseline is not None:  # the same commands from another commit's code, against the same stack
            trees["baseline"] = {**env, "PYTHONPATH": str(baseline)}
        samples = {tree: Samples() for tree in trees}
        for round_ in range(rounds):
            wall, cpu, _ = timed([sys.executable, "-c", "pass"], env, work)
            python_walls.append(wall)
            python_cpus.append(cpu)
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))  # neither always goes first
            for tree in order:
                samples[tree].take(trees[tree], work)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()

    figures: dict[str, Any] = {
        "goal_s": GOAL_S,
        "rounds": rounds,
        "python_startup": {"wall_s": summary(python_walls), "cpu_s": summary(python_cpus)},
        "commands": samples["current"].figures(),
    }
    figures["goal_met"] = all(command["goal_met"] for command in figures["commands"].values())
    if baseline is not None:
        figures["baseline"] = {"commit": baseline_commit, "commands": samples["baseline"].figures()}
    return figures


class Samples:
    """Each command's times, and its module's import time, from one tree of code."""

    def __init__(self) -> None:
        self.walls: dict[str, list[float]] = {name: [] for name in COMMANDS}
        self.cpus: dict[str, list[float]] = {name: [] for name in COMMANDS}
        self.imports: dict[str, list[float]] = {}
        self.heaviest: dict[str, list[tuple[str, float]]] = {}

    def take(self, env: dict[str, str], work: Path) -> None:
        for name, (arguments, _) in COMMANDS.items():
            wall, cpu, done = timed([str(DAEDALUS), *arguments], env, work)
            if done.returncode != 0:
                raise SystemExit(f"`daedalus {' '.join(arguments)}` failed:\n{done.stdout}{done.stderr}")
            self.walls[name].append(wall)
            self.cpus[name].append(cpu)
        for module in sorted({module for _, module in COMMANDS.values()}):
            seconds, top = import_time(f"daedalus.cli.{module}", env, work)
            self.imports.setdefault(module, []).append(seconds)
            self.heaviest[module] = top

    def figures(self) -> dict[str, Any]:
        commands = {}
        for name, (arguments, module) in COMMANDS.items():
            wall = summary(self.walls[name])
            commands[name] = {
                "argv": ["daedalus", *arguments],
                "module": f"daedalus.cli.{module}",
                "wall_s": wall,
                "cpu_s": summary(self.cpus[name]),
                "import_s": round(statistics.median(self.imports[module]), 4),
                "heaviest_imports": [[found, round(seconds, 4)] for found, seconds in self.heaviest[module]],
                "goal_met": wall["median"] < GOAL_S,
            }
        return commands


def show(figures: dict[str, Any]) -> None:
    console = Console(width=max(Console().width, 130))
    baseline = figures.get("baseline")
    columns = [
        "command",
        "wall median",
        "wall max",
        "CPU median",
        "module import",
        f"goal < {figures['goal_s']:.0f} s",
    ]
    if baseline:
        columns += [f"at {baseline['commit'][:10]}: wall median / CPU / import"]
    table = Table(
        *columns, title=f"CLI start-up, {figures['rounds']} runs each, against a running `daedalus up`"
    )
    python = figures["python_startup"]
    first = [f"{python['wall_s']['median']:.2f} s", f"{python['wall_s']['max']:.2f} s"]
    table.add_row(
        "python -c pass", *first, f"{python['cpu_s']['median']:.2f} s", "", "", *([""] if baseline else [])
    )
    for name, row in figures["commands"].items():
        cells = [
            f"daedalus {name}",
            f"{row['wall_s']['median']:.2f} s",
            f"{row['wall_s']['max']:.2f} s",
            f"{row['cpu_s']['median']:.2f} s",
            f"{row['import_s']:.2f} s",
            "[green]met[/green]" if row["goal_met"] else "[red]MISSED[/red]",
        ]
        if baseline:
            old = baseline["commands"][name]
            cells.append(
                f"{old['wall_s']['median']:.2f} s / {old['cpu_s']['median']:.2f} s / {old['import_s']:.2f} s"
            )
        table.add_row(*cells)
    console.print(table)
    for module in sorted({row["module"] for row in figures["commands"].values()}):
        row = next(r for r in figures["commands"].values() if r["module"] == module)
        heavy = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in row["heaviest_imports"])
        console.print(f"{module} pulls in: {heavy or 'nothing heavy'}")
    console.print(
        "goal met for every command"
        if figures["goal_met"]
        else "[red]goal MISSED for at least one command[/red]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="runs of each command (interleaved)")
    parser.add_argument("--results", type=Path, default=RESULTS / "cli_startup.json")
    parser.add_argument(
        "--baseline",
        metavar="COMMIT",
        help="also time the same commands from this commit's src/ (git archive), interleaved round by round",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1 (got {args.rounds})")
    if not DAEDALUS.exists():
        parser.error(f"{DAEDALUS} is missing: run this with the virtualenv's python (.venv/bin/python)")
    recording = Recording.start()
    work = Path(tempfile.mkdtemp(prefix="daedalus-cli-startup-"))
    try:
        baseline, baseline_commit = None, None
        if args.baseline is not None:
            baseline_commit, baseline = checkout(args.baseline, work / "baseline")
        figures = measure(args.rounds, work, baseline, baseline_commit)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    show(figures)
    recording.write(figures, args.results)


if __name__ == "__main__":
    main()
