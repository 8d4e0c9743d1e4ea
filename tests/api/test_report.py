"""/report over HTTP: the latest report from the store, HTML or Markdown, for a caller with a token."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import Engine

from tests.api.conftest import as_
from tests.report.seeded import fill


async def test_report_as_html_and_markdown(
    api: httpx.AsyncClient, sqlite_engine: Engine, tmp_path: Path
) -> None:
    fill(sqlite_engine, tmp_path / "artifacts")
    assert (await api.get("/report")).status_code == 401
    page = await api.get("/report", headers=as_("wayne"))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<section id="campaigns">' in page.text and page.text.count("<svg") == 3
    md = await api.get("/report", params={"format": "md", "since": "6h"}, headers=as_("wayne"))
    assert md.headers["content-type"].startswith("text/markdown")
    assert "## Lessons and traps" in md.text and "<svg" not in md.text
    # a window that ends before anything happened shows the pending decisions, and no tickets
    narrow = await api.get("/report", params={"format": "md", "since": "1m"}, headers=as_("wayne"))
    assert "No ticket changed in this window." in narrow.text and "5-dispatch-1" in narrow.text


async def test_report_refuses_a_bad_window(api: httpx.AsyncClient) -> None:
    for bad in ("yesterday", "0h", "5w", "400d", "99999999999d", "²d", "1e9d", "-3h"):
        response = await api.get("/report", params={"since": bad}, headers=as_("wayne"))
        assert response.status_code == 422, bad
        assert "30m, 24h, 7d" in response.text or "366 days" in response.text
    wrong = await api.get("/report", params={"format": "pdf"}, headers=as_("wayne"))
    assert wrong.status_code == 422
