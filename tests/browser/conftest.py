"""Headless Chromium (Debian's `chromium`, installed by `make system`) driven with playwright — never a
downloaded browser. Each test gets a fresh profile and a page that records every request it makes."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest

CHROMIUM = os.environ.get("DAEDALUS_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    found = shutil.which(CHROMIUM) if not os.path.isabs(CHROMIUM) else CHROMIUM
    if not found or not os.access(found, os.X_OK):
        pytest.skip(
            f"browser tests need Chromium at {CHROMIUM} (set DAEDALUS_CHROMIUM to another path); "
            "install it with `make system` (Debian package `chromium`)"
        )
    return found


@dataclass
class Visit:
    """What the page asked the network for, and what it could not load."""

    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)

    def off_host(self) -> list[str]:
        """Requests that left 127.0.0.1 (data: and about: URLs never touch the network)."""
        out = []
        for url in self.requests:
            parsed = urlparse(url)
            if parsed.scheme in ("data", "about", "blob"):
                continue
            if parsed.scheme == "file" or parsed.hostname in ("127.0.0.1", "localhost"):
                continue
            out.append(url)
        return out


@pytest.fixture(scope="session")
def browser_path() -> str:
    return chromium_path()


@pytest.fixture
async def browser_context(browser_path: str, tmp_path: Path) -> AsyncIterator[object]:
    from playwright.async_api import async_playwright

    profile = tmp_path / "chromium-profile"
    async with async_playwright() as p:
        context = await p.chromium.launch_persistent_context(
            str(profile),
            executable_path=browser_path,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            await context.close()


@pytest.fixture
def visit() -> Iterator[Visit]:
    yield Visit()


def watch(page: object, visit: Visit) -> None:
    """Record the page's requests, failed loads and console errors into `visit`."""
    page.on("request", lambda r: visit.requests.append(r.url))  # type: ignore[attr-defined]
    page.on("requestfailed", lambda r: visit.failed.append(f"{r.url}: {r.failure}"))  # type: ignore[attr-defined]
    page.on(  # type: ignore[attr-defined]
        "console", lambda m: visit.console_errors.append(m.text) if m.type == "error" else None
    )
