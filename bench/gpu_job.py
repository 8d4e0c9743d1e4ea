"""A simulated GPU job for bench/pool.py: logs when it starts and ends on the GPUs its lease gave it.

It appends {"lease", "gpus", "event", "t"} lines to --ledger, and stops at once if its supervisor dies (its
parent changes), as a job under a dead worker would be killed by the retried step anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


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
    args = parser.parse_args()
    parent = os.getppid()
    stopped = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    write(args.ledger, "start")
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and not stopped and os.getppid() == parent:
        time.sleep(0.02)
    write(args.ledger, "end")
    sys.exit(0 if time.monotonic() >= deadline else 1)


if __name__ == "__main__":
    main()
