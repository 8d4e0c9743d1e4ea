"""What an oversized request costs the API: peak server memory and time to answer.

`daedalus api serve` runs as a real process (uvicorn); a client streams a body of N MB in 64 KiB chunks, with a
bad bearer token (the attack in issue 8) and with a good one. The server's RSS is sampled every 10 ms while the
request is in flight; the figure is the peak over its RSS before the request. No Temporal is needed: the body
is refused before any handler runs.

Run: .venv/bin/python bench/api_body_limit.py [--mb 200] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daedalus.ports import free_port, wait_until_open  # noqa: E402
from daedalus.store import tokens as api_tokens  # noqa: E402
from daedalus.store.database import make_engine, migrate  # noqa: E402
from record import Recording  # noqa: E402

MiB = 1024 * 1024
GOOD_TOKEN = "dtk_000000a0_" + "g" * 43


def chunks(total: int) -> Iterator[bytes]:
    piece = b"x" * (64 * 1024)
    for _ in range(total // len(piece)):
        yield piece


def one_request(base: str, server: psutil.Process, mb: int, token: str) -> dict[str, Any]:
    baseline = server.memory_info().rss
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, server.memory_info().rss)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.perf_counter()
    try:
        answer = httpx.post(
            f"{base}/tickets",
            content=chunks(mb * MiB),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=120,
        )
        status = answer.status_code
    except httpx.HTTPError as error:  # the server may close the connection once it has answered
        status = f"closed ({type(error).__name__})"
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    return {"status": status, "seconds": elapsed, "peak_extra_mib": (peak - baseline) / MiB}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    recording = Recording.start()
    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        env = {
            **os.environ,
            "DAEDALUS_HOME": home,
            "DAEDALUS_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",  # nothing listens: never reached
        }
        store = make_engine(f"sqlite:///{Path(home) / 'daedalus.db'}")
        migrate(store)
        api_tokens.add(store, "wayne", GOOD_TOKEN, created_by="bench")
        store.dispose()
        command = [
            sys.executable,
            "-c",
            "from daedalus.cli.api import app; app()",
            "serve",
            "--port",
            str(port),
        ]
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_open(port, "the API")
            server = psutil.Process(process.pid)
            rows = []
            for label, token in (("bad token", "not-a-token"), ("good token", GOOD_TOKEN)):
                runs = [one_request(base, server, args.mb, token) for _ in range(args.runs)]
                rows.append(
                    {
                        "request": f"{args.mb} MB body, {label}",
                        "status": sorted({str(r["status"]) for r in runs}),
                        "median_seconds": statistics.median(r["seconds"] for r in runs),
                        "max_peak_extra_mib": max(r["peak_extra_mib"] for r in runs),
                        "runs": runs,
                    }
                )
        finally:
            process.terminate()
            process.wait(10)
    table = Table(title="API: cost of an oversized request (peak server RSS over its idle RSS)")
    for column in ("request", "answer", "median s", "max peak extra MiB", "runs"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["request"], ", ".join(row["status"]), f"{row['median_seconds']:.3f}",
            f"{row['max_peak_extra_mib']:.1f}", str(len(row["runs"])),
        )  # fmt: skip
    Console().print(table)
    recording.write({"mb": args.mb, "rows": rows}, ROOT / "bench" / "results" / "api_body_limit.json")


if __name__ == "__main__":
    main()
