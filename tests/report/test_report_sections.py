"""The report from a store filled like the seed's day: every section, nested children, raw rounds, charts."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine

from daedalus.report import build_report, render_html, render_markdown
from daedalus.store.database import session_scope
from tests.report import seeded
from tests.report.seeded import fill


def built(engine: Engine, tmp_path: Path):  # type: ignore[no-untyped-def]
    since = fill(engine, tmp_path / "artifacts")
    with session_scope(engine) as session:
        return build_report(session=session, since=since)


def test_markdown_has_the_seeds_sections(store_engine: Engine, tmp_path: Path) -> None:
    report = built(store_engine, tmp_path)
    text = render_markdown(report)
    for heading in (
        "## Status",
        "## Tickets",
        "## Campaigns",
        "## Training runs",
        "## Decisions",
        "## Lessons and traps",
    ):
        assert heading in text, heading
    # headline card with the first gate's figure
    assert (
        "| Ticket 4: MTP align tax fix | closed under exception; single-user decode PASS 55.9 tok/s |" in text
    )
    # before (the first attempt's failing median) and after, the raw rounds, the interval and provenance
    assert (
        "| single-user decode | PASS | 29 tok/s | 55.9 tok/s | [55.7, 56.2] (90%) | decode_tps >= 55 |"
        in text
    )
    assert "55.1, 56, 55.7, 56.4, 55.9, 56.2, 55.8" in text
    assert "host mavis, commit f7332846aa, attempt 2" in text
    # the host's load while the gate's rounds ran (MEASUREMENT.md: contention is part of the evidence)
    assert f"- single-user decode host load: {seeded.HOST_LOAD}" in text
    # an A/B gate: before is the baseline, after the candidate, with both sides' rounds
    assert "| batch-8 MTP vs AR | FAIL | 274.9 tok/s | 231.9 tok/s |" in text
    assert "231.9, 230.4, 233 vs baseline 274.9, 276.1, 273.3" in text
    # children nested under their parent, in order
    assert text.index("### Ticket 6: TP4/MTP case") < text.index(
        "#### Ticket 6e: MTP k=3 search (child of 6)"
    )
    assert text.index("#### Ticket 6e") < text.index("#### Ticket 6f: 8-user A/B (child of 6)")
    # the campaign matrix with the seed's labels, the crash as a finding, the quality label, the proposal
    assert (
        "| fp16 (baseline) | context 65536, users 1 | crashed: server OOM-killed at 64K (the wall) |" in text
    )
    assert re.search(
        r"\| fp8 e5m2 \| context 16384, users 1 \| 60\.25 \| .* \| 0/3 \| digit soup \| - \| no \|", text
    )
    assert "Proposed: **tq_4bit_nc-c16384**" in text
    # training: deaths, the fitted slope, the curve's provenance
    assert (
        "| drafter | restarting | 2 | 19 | drafter#7 died: watchdog_stop: leak 19 GiB/h, stopped after 3.3 h |"
        in text
    )
    assert "201 samples from" in text
    # decisions waiting (with delegates) and made in the window, with the decider's note
    assert "**5-dispatch-1** (wayne, lead" in text
    assert (
        "**6f-dispatch-1**: Dispatch ticket 6f (8-user A/B) to codex on mavis? → **approve** by wayne via slack"
        in text
    )
    assert "same conditions, 3 rounds each" in text
    assert "| trap | engine 1cat-vllm | profiler interval=100 changes the output" in text


def test_html_is_self_contained_with_one_chart_per_subject(store_engine: Engine, tmp_path: Path) -> None:
    page = render_html(built(store_engine, tmp_path))
    assert page.startswith("<!doctype html>")
    kinds = re.findall(r'<figure class="chart" data-kind="(\w+)"', page)
    # ticket 4 has gates (intervals), the campaign a heat map, the training run its memory curves
    assert kinds.count("intervals") == 1 and kinds.count("heatmap") == 1 and kinds.count("memory") == 1
    assert page.count("<svg") == 3
    # nothing to fetch: no scripts, no external stylesheets or images, no URLs but the SVG namespaces
    assert "<script" not in page and "<link" not in page and "<img" not in page
    urls = set(re.findall(r"https?://[^\"' )]+", page))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    # SVG ids stay unique when several charts share the page
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))


def test_markup_in_titles_is_escaped(sqlite_engine: Engine, tmp_path: Path) -> None:
    from daedalus.schemas.audit import AuditKind, AuditRecord
    from daedalus.store.records import apply
    from tests.report.seeded import _event, _snapshot
    from tests.support import TEST_AUDIT_KEY

    with session_scope(sqlite_engine) as session:
        apply(
            session=session,
            record=AuditRecord(
                event=_event("x1", 1, datetime.now(UTC), AuditKind.FILED, "draft", "filed"),
                ticket=_snapshot("x1", "<script>alert(1)</script> | pipes", "draft"),
            ),
            key=TEST_AUDIT_KEY,
        )
    with session_scope(sqlite_engine) as session:
        report = build_report(session=session, since=datetime(2000, 1, 1, tzinfo=UTC))
    page = render_html(report)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "\\| pipes" in render_markdown(report)


def test_empty_window_says_so(sqlite_engine: Engine) -> None:
    with session_scope(sqlite_engine) as session:
        report = build_report(session=session, since=datetime.now(UTC))
    text = render_markdown(report)
    assert "No ticket changed in this window." in text and "No lesson or trap was recorded" in text
    assert "## Campaigns" not in text and "<svg" not in render_html(report)
