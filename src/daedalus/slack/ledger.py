"""Which decision requests were already posted, so a retried activity does not post twice.

One small JSON file per (request id, reminder number), written atomically after Slack answered. A crash between
Slack's answer and the write can still post twice; that is the one window left, and it is rare and harmless.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from daedalus.slack.models import PostedMessage


class PostedLedger:
    def __init__(self, root: Path):
        self.root = root

    def _path(self, request_id: str, reminder: int) -> Path:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", request_id)
        return self.root / f"{safe}.{reminder}.json"

    def get(self, request_id: str, reminder: int) -> PostedMessage | None:
        try:
            return PostedMessage.model_validate_json(self._path(request_id, reminder).read_text())
        except FileNotFoundError:
            return None

    def put(self, request_id: str, reminder: int, message: PostedMessage) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        target = self._path(request_id, reminder)
        fd, temporary = tempfile.mkstemp(dir=self.root, prefix=".posting-")
        with os.fdopen(fd, "w") as handle:
            handle.write(message.model_dump_json())
        os.replace(temporary, target)
