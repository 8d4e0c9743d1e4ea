"""The operators' view: the Temporal UI (2.54, the dev server's own) behind Daedalus's read-only proxy, in a fresh
Chromium profile. With no set-up in the browser, the workflow list shows each ticket's title and Daedalus's
columns, the views bar holds the saved views (the weekly one dated seven days back from now), a ticket picked
from the list opens on its current state, and a column a person chose is kept."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from daedalus import services
from daedalus.devserver import DevServer
from daedalus.payloads import DATA_CONVERTER
from daedalus.ports import free_port
from daedalus.readonly_ui import ReadOnlyUi
from daedalus.ui_defaults import COLUMNS
from tests.browser.conftest import Visit, watch
from tests.support import make_engine_repo, ticket_spec

WAIT_MS = 60_000


@pytest.fixture
async def proxied_ui() -> AsyncIterator[tuple[DevServer, str]]:
    server = DevServer(db_file=None, port=free_port(), ui_port=free_port(), die_with_parent=True)
    await asyncio.to_thread(server.start)
    port = free_port()
    proxy = ReadOnlyUi(upstream_port=server.ui_port or 0, port=port)
    await proxy.start()
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await proxy.stop()
        await asyncio.to_thread(server.stop)


async def test_the_list_shows_titles_and_the_saved_views_without_set_up(
    browser_context: Any, visit: Visit, proxied_ui: tuple[DevServer, str], tmp_path: Path
) -> None:
    server, base = proxied_ui
    client = await Client.connect(server.address, data_converter=DATA_CONVERTER)
    spec = ticket_spec(make_engine_repo(tmp_path / "repo"), "mavis", title="Chunk the TQ decode workspace")
    # Nobody polls this queue: the list shows the ticket as filed, with the attributes it started with.
    await services.file_ticket(client, spec, queue="nobody-polls-this")
    page = await browser_context.new_page()
    watch(page, visit)
    await page.goto(f"{base}/namespaces/default/workflows")
    row = page.locator("tr", has_text=f"ticket-{spec.id}")
    await row.wait_for(timeout=WAIT_MS)
    assert "Chunk the TQ decode workspace" in await row.inner_text()
    headers = await page.locator("table thead").inner_text()
    for column in COLUMNS:
        assert column in headers, headers
    stored = json.loads(await page.evaluate("window.localStorage.getItem('saved-workflow-queries')"))
    views = {view["id"]: view for view in stored["default"]}
    assert views["daedalus-waiting"]["name"] == "Waiting for a decision"
    weekly = views["daedalus-failed-week"]["query"]
    since = datetime.fromisoformat(weekly.split('CloseTime > "')[1].rstrip('"').replace("Z", "+00:00"))
    assert abs(since - (datetime.now(UTC) - timedelta(days=7))) < timedelta(minutes=5), weekly
    views_button = page.locator("button", has_text="Saved Views").first
    assert " ".join((await views_button.inner_text()).split()) == "Saved Views 5 / 50"  # it counts ours
    await views_button.click()
    await page.get_by_text("Failed in the last 7 days").first.wait_for(timeout=WAIT_MS)

    # A ticket picked from the list opens on its current state (User Metadata), not the input JSON.
    await page.keyboard.press("Escape")
    await row.get_by_role("link", name=f"ticket-{spec.id}").click()
    await page.wait_for_url(f"**/workflows/ticket-{spec.id}/*/user-metadata", timeout=WAIT_MS)
    summary = page.frame_locator("iframe").first  # the UI renders a summary's Markdown in a frame of its own
    await summary.get_by_text("Chunk the TQ decode workspace").first.wait_for(timeout=WAIT_MS)
    await page.goto(f"{base}/namespaces/default/workflows")

    # A person's own columns are theirs: the next page keeps them (the views are made afresh).
    mine = {"default": [{"label": "Status"}, {"label": "Workflow ID"}, {"label": "DaedalusHost"}]}
    await page.evaluate(
        "columns => window.localStorage.setItem('namespace-workflow-table-columns', JSON.stringify(columns))",
        mine,
    )
    await page.reload()
    await page.locator("tr", has_text=f"ticket-{spec.id}").wait_for(timeout=WAIT_MS)
    kept = json.loads(await page.evaluate("window.localStorage.getItem('namespace-workflow-table-columns')"))
    assert kept == mine
    assert not [e for e in visit.console_errors if "Content Security Policy" in e], visit.console_errors
