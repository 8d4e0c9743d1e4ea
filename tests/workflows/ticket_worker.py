"""The control and host workers of one test ticket, as a real child process the tests can SIGKILL mid-step.

Usage: python -m tests.workflows.ticket_worker ADDRESS CONTROL_QUEUE HOST TMP_DIR [--database-url URL]

Without --database-url it runs only the host worker (agents, builds, gates); with it, the control worker too
(workflows and the audit store), exactly as `build_workers` assembles them for `daedalus worker`.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from temporalio.client import Client

from daedalus.payloads import DATA_CONVERTER
from daedalus.store.database import make_engine
from daedalus.worker import WorkerConfig, build_workers
from tests.support import TEST_AUDIT_KEY, TEST_STEPS


async def main(address: str, control_queue: str, host: str, tmp: Path, database_url: str | None) -> None:
    client = await Client.connect(address, data_converter=DATA_CONVERTER)
    config = WorkerConfig(
        steps=TEST_STEPS,
        audit_key=TEST_AUDIT_KEY,
        control_queue=control_queue,
        hosts=[host],
        workspace_root=tmp / "ws",
        artifacts=tmp / "artifacts",
        fail_workflows_on_bugs=True,
    )
    engine = make_engine(database_url) if database_url else None
    workers = build_workers(client, config, engine)
    tasks = [asyncio.create_task(w.run()) for w in workers]
    await asyncio.sleep(0.5)  # let every worker open its pollers
    print("worker ready", flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("control_queue")
    parser.add_argument("host")
    parser.add_argument("tmp", type=Path)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    asyncio.run(main(args.address, args.control_queue, args.host, args.tmp, args.database_url))
