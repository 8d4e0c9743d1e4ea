"""A simulated GPU job for bench/pool.py: logs when it starts and ends on the GPUs its lease gave it.

It appends {"lease", "gpus", "event", "t"} lines to --ledger, and stops at once if its supervisor dies (its
parent changes), as a job under a dead worker would be killed by the retried step anyway. With --measure it
works (a CPU loop standing in for the GPU's work, in 7 slices of its time) and prints the slices' loops per
second as a gate measurement: a ticket's gate judges what the job really did, not a number it was given.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

SLICES = 7


def write(ledger: Path, event: str) -> None:
    line = {
        "lease": os.environ.get("DAEDALUS_LEASE_ID", "?"),
        "gpus": [int(g) for g in os.environ.get("DAEDALUS_LEASE_GPUS", "").split(",") if g],
        "event": event,
        "t": time.time(),
        "pid": os.getpid(),
    }
    with ledger.open("a") as out:
        out.write(json.dumps(line) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--ledger", type=Path, required=True)
    parser.add_argument("--measure", action="store_true", help="work, and print the work's rate per slice")
    args = parser.parse_args()
    parent = os.getppid()
    stopped = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    write(args.ledger, "start")
    deadline = time.monotonic() + args.seconds
    rates: list[float] = []
    while time.monotonic() < deadline and not stopped and os.getppid() == parent:
        if not args.measure:
            time.sleep(0.02)
            continue
        began, loops, until = time.monotonic(), 0, min(deadline, time.monotonic() + args.seconds / SLICES)
        while time.monotonic() < until:
            sum(range(1000))
            loops += 1
        rates.append(loops / (time.monotonic() - began))
    write(args.ledger, "end")
    finished = time.monotonic() >= deadline
    if args.measure and finished:
        print(json.dumps({"samples": rates, "unit": "loops/s"}))
    sys.exit(0 if finished else 1)


if __name__ == "__main__":
    main()
