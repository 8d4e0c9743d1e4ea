"""A host worker for training runs, as a real child process the tests can SIGKILL mid-run.

Usage: python -m tests.workflows.training_worker ADDRESS TASK_QUEUE ARTIFACT_DIR
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from daedalus.activities.training import TrainingActivities
from daedalus.payloads import DATA_CONVERTER


async def main(address: str, task_queue: str, artifacts: Path) -> None:
    client = await Client.connect(address, data_converter=DATA_CONVERTER)
    acts = TrainingActivities(artifacts)
    async with Worker(
        client, task_queue=task_queue, activities=[acts.supervise_training, acts.training_host_report]
    ):
        print("worker ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
