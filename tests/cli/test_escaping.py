"""A hostile title, summary or note is shown as text: no rich markup, no terminal escapes, no NUL.

`daedalus audit` and `daedalus ticket list` run as real processes over a SQLite store that holds the events;
`ticket show`'s rendering runs in-process on a TicketState with the same title.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from daedalus.cli import tickets as ticket_cli
from daedalus.escaping import for_slack, for_terminal, plain
from daedalus.report.model import Report
from daedalus.report.summary import summary_text
from daedalus.schemas.audit import AuditKind
from daedalus.schemas.lessons import Lesson, LessonKind, SubjectKind
from daedalus.schemas.ticket import DecisionKind, DecisionRequest, TicketSpec, TicketState, TicketStatus
from daedalus.store import lessons as lesson_store
from daedalus.store.database import make_engine, migrate, session_scope
from daedalus.store.tables import DecisionRow
from tests.store.test_records import record, write

DAEDALUS = str(Path(sys.executable).parent / "daedalus")
HOSTILE = [
    "innocent [/bold] title",
    "[link=https://evil.example]click[/link] [bold red]PASS",
    "osc \x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\ and csi \x1b[2J\x1b[31mred",
    "nul \x00 bell \x07 cr \r back \x08",
    "bidi \u202egnp.exe",
    "ends in a backslash \\",
]


def test_plain_makes_every_control_character_visible() -> None:
    assert plain("a\x1b[31mb\x00c\u202e\tline\n") == "a\\x1b[31mb\\x00c\\u202e\tline\n"


@pytest.mark.parametrize("text", HOSTILE)
def test_for_terminal_renders_exactly_the_visible_text(text: str) -> None:
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor", width=400).print(
        f"[bold]>[/bold] {for_terminal(text)} [red]<[/red]"
    )
    rendered = out.getvalue()
    assert "\x00" not in rendered and "\x07" not in rendered and "\u202e" not in rendered
    assert "\x1b]8;;https://evil" not in rendered  # no hyperlink or OSC the title asked for
    assert _strip_style(rendered).startswith(f"> {plain(text)}")  # our markup after it still applies
    plain_out = io.StringIO()
    Console(file=plain_out, width=400, color_system=None).print(for_terminal(text))
    # alone, what is printed is the text with its controls made visible (rich doubles a trailing backslash
    # so that markup after it cannot be escaped by it: shown twice when nothing follows)
    doubled = "\\" if text.endswith("\\") else ""
    assert plain_out.getvalue().rstrip("\n") == plain(text) + doubled


def test_slack_escaping_keeps_mentions_and_links_from_being_parsed() -> None:
    assert for_slack("<!channel> & <https://evil|https://good>") == (
        "&lt;!channel&gt; &amp; &lt;https://evil|https://good&gt;"
    )


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    engine = make_engine(f"sqlite:///{home / 'daedalus.db'}")
    migrate(engine)
    for seq, text in enumerate(HOSTILE, start=1):
        rec = record(seq, ticket_id="evil", title=HOSTILE[0], kind=AuditKind.TRANSITION)
        rec = rec.model_copy(
            update={"event": rec.event.model_copy(update={"summary": text, "actor": "mallory"})}
        )
        write(engine, rec)
    with session_scope(engine) as session:
        for text in HOSTILE:
            lesson = Lesson(subject_kind=SubjectKind.ENGINE, subject="evil " + text[:20], kind=LessonKind.TRAP,
                            text=text, source=text[:40], recorded_at=datetime.now(UTC))  # fmt: skip
            lesson_store.record(session=session, lesson=lesson)
    engine.dispose()
    return {**os.environ, "DAEDALUS_HOME": str(home), "COLUMNS": "400", "TERM": "xterm-256color"}


@pytest.mark.parametrize(
    "command", [["audit", "--ticket", "evil"], ["ticket", "list"], ["report", "--since", "2000-01-01"]]
)
def test_the_cli_shows_hostile_text_without_obeying_it(cli_env: dict[str, str], command: list[str]) -> None:
    done = subprocess.run([DAEDALUS, *command], env=cli_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "innocent [/bold] title" in done.stdout
    assert "\x1b" not in done.stdout and "\x00" not in done.stdout and "\u202e" not in done.stdout
    if command[0] == "audit":
        assert "\\x1b]8;;https://evil.example" in done.stdout and "\\x00" in done.stdout
        assert "[link=https://evil.example]click[/link]" in done.stdout


def test_lessons_list_shows_hostile_lessons_without_obeying_them(cli_env: dict[str, str]) -> None:
    done = subprocess.run(
        [DAEDALUS, "lessons", "list"], env=cli_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    shown = " ".join(done.stdout.split())  # rich wraps the lesson column
    assert "[link=https://evil.example]click[/link]" in shown, done.stdout
    assert "\\x1b]8;;https://evil.example" in shown and "\\x00" in shown and "\\u202e" in shown, done.stdout
    assert "\x1b" not in done.stdout and "\x00" not in done.stdout and "\u202e" not in done.stdout


def test_ticket_show_renders_a_hostile_title_question_and_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = TicketSpec.model_validate(
        {"id": "evil", "title": HOSTILE[0], "host": "h", "gates": [{"name": "g", "metric": "needle",
         "threshold": 1, "command": "true"}]}
    )  # fmt: skip
    request = DecisionRequest(
        id="evil-dispatch-1",
        ticket_id="evil",
        kind=DecisionKind.DISPATCH,
        question=f"Dispatch {HOSTILE[2]}?",
        options=["approve", "reject"],
        deciders=["wayne"],
        requested_at=datetime(2026, 11, 30, tzinfo=UTC),
    )
    state = TicketState(
        spec=spec, status=TicketStatus.AWAITING_APPROVAL, pending_decision=request, outcome_reason=HOSTILE[1]
    )
    out = io.StringIO()
    monkeypatch.setattr(ticket_cli, "console", Console(file=out, force_terminal=True, width=400))
    ticket_cli.print_state(state)
    shown = out.getvalue()
    assert "innocent [/bold] title" in _strip_style(shown)
    assert "\x1b]8" not in shown and "\\x1b]8;;https://evil.example" in _strip_style(shown)
    assert "[link=https://evil.example]click[/link]" in _strip_style(shown)


def _strip_style(text: str) -> str:
    """Our own styling (SGR sequences rich writes) removed, to compare the text a person reads."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_the_slack_digest_escapes_what_it_takes_from_the_store() -> None:
    now = datetime.now(UTC)
    pending = DecisionRow(
        request_id="evil-escalation-1",
        ticket_id="evil",
        kind="escalation",
        question="<!channel> approve <https://evil.example|https://good.example> & now",
        deciders=["<!here>"],
        requested_at=now,
    )
    report = Report(
        since=now, generated_at=now, cards=[], tickets=[], training=[], campaigns=[], pending=[pending],
        decided=[], lessons=[], waiting_on_hosts={"<@U123>": "queued for <!everyone>"},
    )  # fmt: skip
    text = summary_text(report, link="https://daedalus.example/report")
    assert "&lt;!channel&gt;" in text and "&lt;!here&gt;" in text and "&lt;!everyone&gt;" in text, text
    assert "&lt;https://evil.example|https://good.example&gt; &amp; now" in text, text
    assert "&lt;@U123&gt;" in text, text
    # The digest's own link is the only one Slack may parse.
    assert text.count("<") == 1 and text.endswith("<https://daedalus.example/report|Full report>"), text
