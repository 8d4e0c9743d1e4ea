"""Lessons per engine: one markdown file of bullet lines in the host workspace, read into every prompt."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
MAX_LESSONS = 30


def lessons_file(root: Path, engine: str) -> Path:
    return root / "lessons" / f"{SAFE_NAME.sub('_', engine) or 'default'}.md"


def read_lessons(root: Path, engine: str) -> list[str]:
    """The newest lessons last, at most MAX_LESSONS, so the prompt stays short."""
    path = lessons_file(root, engine)
    if not path.exists():
        return []
    lines = [ln[2:].strip() for ln in path.read_text().splitlines() if ln.startswith("- ")]
    return lines[-MAX_LESSONS:]


def record_lesson(root: Path, engine: str, lesson: str, *, source: str = "") -> Path:
    """Append one lesson (e.g. from a failed gate); repeated lessons are kept once."""
    text = " ".join(lesson.split())
    if not text:
        raise ValueError("a lesson must not be empty")
    if any(existing.startswith(text) for existing in read_lessons(root, engine)):
        return lessons_file(root, engine)
    path = lessons_file(root, engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    with path.open("a") as handle:
        handle.write(f"- {text} ({stamp}{', ' + source if source else ''})\n")
    return path
