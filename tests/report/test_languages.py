"""The report in English and Traditional Chinese (zh-TW), from the committed catalogue.

The catalogue test walks every message the report's code marks (`_`, `N_`, `ngettext`, found by Babel's own
extractor, as a translator's tools would) and fails on one without a translation, with a placeholder the
translation drops or adds, or on a catalogue entry no code uses any more. The rendering tests build the seeded
day in both languages: the same sections, no English heading or table header left in zh-TW, and every number
(figures, ids, dates, counts) the same in both.
"""

from __future__ import annotations

import os
import re
import string
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.mofile import read_mo
from babel.messages.pofile import read_po
from sqlalchemy import Engine

from daedalus.decisions.rulings import Ruling
from daedalus.report import build_report, i18n, render_html, render_markdown
from daedalus.report.i18n import LANGUAGES, UnknownLanguage, language, po_path
from daedalus.report.questions import QuestionLine, QuestionsView, questions_sections
from daedalus.report.sections import sections
from daedalus.store.database import session_scope
from tests.api.conftest import api, as_, slack, slack_settings  # noqa: F401 (fixtures for the /report test)
from tests.report.seeded import fill

REPORT_SOURCES = Path(i18n.__file__).parent
KEYWORDS = {"_": None, "N_": None, "ngettext": (1, 2)}
NUMBER = re.compile(r"[0-9]+(?:[.,][0-9]+)*")
DAEDALUS = Path(sys.executable).with_name("daedalus")


def used_messages() -> set[str | tuple[str, str]]:
    found = extract_from_dir(
        str(REPORT_SOURCES), method_map=[("**.py", "python")], keywords=KEYWORDS, comment_tags=()
    )
    return {message for _file, _line, message, _comments, _context in found}


def singular(message: str | tuple[str, ...]) -> str:
    return message if isinstance(message, str) else message[0]


def placeholders(text: str) -> set[str]:
    return {name for _literal, name, _spec, _conversion in string.Formatter().parse(text) if name is not None}


@pytest.mark.parametrize("lang", [lang for lang in LANGUAGES if lang != i18n.DEFAULT])
def test_every_message_the_report_uses_is_translated(lang: str) -> None:
    with po_path(lang).open("rb") as source:
        catalog = read_po(source)
    used = used_messages()
    assert len(used) > 100  # the extractor found the report's messages (not an empty walk that cannot fail)
    untranslated, broken = [], []
    for message in used:
        entry = catalog.get(singular(message))
        strings = entry.string if entry is not None else ""
        texts = [s for s in (strings if isinstance(strings, tuple) else (strings,))]
        if entry is None or entry.fuzzy or not all(texts):
            untranslated.append(message)
            continue
        sources = message if isinstance(message, tuple) else (message,)
        broken += [(message, t) for t in texts if placeholders(t) != placeholders(sources[0])]
    assert not untranslated, f"{lang}: no translation in {po_path(lang)} for {untranslated}"
    assert not broken, f"{lang}: placeholders differ: {broken}"
    stale = {singular(e.id) for e in catalog if e.id} - {singular(m) for m in used}
    assert not stale, f"{lang}: catalogue entries no code uses: {stale}"


def hashable(text: str | list[str] | tuple[str, ...]) -> str | tuple[str, ...]:
    """A message's id or string (a plural's are a sequence) as a set member."""
    return text if isinstance(text, str) else tuple(text)


@pytest.mark.parametrize("lang", [lang for lang in LANGUAGES if lang != i18n.DEFAULT])
def test_the_committed_mo_is_its_po_compiled(lang: str) -> None:
    """The report reads the .mo (the standard library's gettext, nothing to install on a host); an edit to the
    .po that was not compiled (`pybabel compile -d src/daedalus/report/locale -D report`) fails here. Messages are
    compared, not bytes: the header's POT-Creation-Date is the time of compiling."""
    with po_path(lang).open("rb") as source:
        po = {(hashable(m.id), hashable(m.string)) for m in read_po(source) if m.id and not m.fuzzy}
    with i18n.mo_path(lang).open("rb") as compiled:
        mo = {(hashable(m.id), hashable(m.string)) for m in read_mo(compiled) if m.id}
    assert len(po) > 100 and mo == po, (
        f"{i18n.mo_path(lang)} is not {po_path(lang)} compiled (differing: {sorted(map(str, mo ^ po))[:5]}): run "
        "`.venv/bin/pybabel compile -d src/daedalus/report/locale -D report`"
    )


def test_no_message_hides_inside_an_f_string() -> None:
    """Babel (on Python 3.11) does not look inside f-strings: a `{_('x')}` there would never be catalogued."""
    hidden = [
        f"{path.name}: {match.group(0)}"
        for path in REPORT_SOURCES.glob("*.py")
        for match in re.finditer(r"""\{\s*(?:_|N_|ngettext|word)\(\s*['"][^}]*""", path.read_text())
    ]
    assert not hidden, hidden


def test_the_seeded_report_in_english_and_zh_tw(store_engine: Engine, tmp_path: Path) -> None:
    since = fill(store_engine, tmp_path / "artifacts")
    with session_scope(store_engine) as session:
        now = datetime(2026, 7, 13, tzinfo=UTC)
        english = build_report(session=session, since=since, now=now)
        chinese = build_report(session=session, since=since, now=now, lang="zh-TW")
    en_sections = sections(english, with_charts=False)
    zh_sections = sections(chinese, with_charts=False)
    assert [s.anchor for s in en_sections] == [s.anchor for s in zh_sections]
    assert {"status", "tickets", "campaigns", "training", "decisions", "lessons"} <= {
        s.anchor for s in zh_sections
    }
    for en, zh in zip(en_sections, zh_sections, strict=True):
        assert en.title != zh.title and not re.search(r"[A-Za-z]", zh.title), (en.title, zh.title)
    en_text, zh_text = render_markdown(english), render_markdown(chinese)
    assert zh_text.startswith("# 進度戰報 — 自 ")
    # No English heading or table header row is left in zh-TW: each is translated, data around it unchanged.
    en_lines = en_text.splitlines()
    fixed = [
        line
        for i, line in enumerate(en_lines)
        if line.startswith("#") or (i + 1 < len(en_lines) and en_lines[i + 1].startswith("|---"))
    ]
    assert len(fixed) > 10
    zh_lines = set(zh_text.splitlines())
    left = [line for line in fixed if line in zh_lines and re.search(r"[A-Za-z]{4,}", line)]
    assert not left, left
    assert "| 閘門 | 判定 | 修前 | 修後 |" in zh_text and "| 檔位 | 工作負載 |" in zh_text
    assert "## 教訓與陷阱" in zh_text and "## 訓練" in zh_text and "## 裁決" in zh_text
    # verdict and status words are translated; data (titles, questions, names) stays as written
    assert "| 通過 |" in zh_text or "| 未通過 |" in zh_text
    # (a gate's stored reason, "decode: PASS by decode_tps >= 55", is the gate's record and stays as written)
    assert not re.search(r"\| (PASS|FAIL|INCONCLUSIVE|INVALID) \|", zh_text)
    assert "closed_under_exception" not in zh_text and "依例外收案" in zh_text
    assert "MTP align tax fix" in zh_text and "Dispatch ticket 6f (8-user A/B) to codex on mavis?" in zh_text
    # the same numbers, in the same amounts, in both languages
    assert Counter(NUMBER.findall(en_text)) == Counter(NUMBER.findall(zh_text))
    page = render_html(chinese)
    assert '<html lang="zh-TW">' in page and "<h2>票</h2>" in page and "Noto Sans CJK TC" in page
    # the charts' captions (their alt text) too; the text drawn inside the SVG stays as matplotlib drew it
    assert "<figcaption>票 4：各閘門的各輪、中位數與信賴區間</figcaption>" in page  # noqa: RUF001
    assert "each gate&#x27;s rounds" not in page and "each gate's rounds" not in page
    for section in en_sections:
        assert f'<section id="{section.anchor}">' in page


def test_questions_and_rulings_in_both_languages() -> None:
    at = datetime(2026, 7, 12, 9, 30, tzinfo=UTC)
    view = QuestionsView(
        open=[
            QuestionLine(
                "q-1",
                "pool-models",
                "Which dense models enter the pool?",
                ["qwen", "none"],
                ["wayne"],
                at,
                "2026-07-14 18:00",
            )
        ],
        done=[
            QuestionLine(
                "q-2",
                "kv",
                "KV quantization?",
                ["tbq", "fp8"],
                ["wayne"],
                at,
                "",
                state="ruled",
                outcome="tbq",
                decided_by="wayne",
                closed_at=at,
                note="always TBQ",
            )
        ],
        rulings=[Ruling(id="kv", statement="KV is always TBQ", ruled_by="wayne", ruled_at=at)],
    )
    english = questions_sections(view)
    with language("zh-TW"):
        chinese = questions_sections(view)
    assert [s.anchor for s in english] == [s.anchor for s in chinese] == ["questions", "rulings"]
    assert [s.title for s in chinese] == ["等 wayne 裁決", "常設裁決"]
    zh = "\n".join(s.markdown for s in chinese)
    en = "\n".join(s.markdown for s in english)
    assert "| 裁決 | 規則 | 裁決者 | 時間 |" in zh and "已裁決 **tbq**（wayne）" in zh  # noqa: RUF001
    assert "`daedalus decide q-1 <option>`" in zh and "KV is always TBQ" in zh  # commands and data as written
    assert Counter(NUMBER.findall(en)) == Counter(NUMBER.findall(zh))


def test_an_unknown_language_is_refused_with_the_known_ones(sqlite_engine: Engine, tmp_path: Path) -> None:
    with pytest.raises(UnknownLanguage, match=r"'fr'.*en, zh-TW"), session_scope(sqlite_engine) as session:
        build_report(session=session, since=datetime(2026, 7, 12, tzinfo=UTC), lang="fr")
    env = {
        **os.environ,
        "DAEDALUS_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "COLUMNS": "250",
    }
    refused = subprocess.run(
        [DAEDALUS, "report", "--lang", "fr"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode != 0
    assert "unknown report language 'fr'; use one of: en, zh-TW" in " ".join(
        (refused.stdout + refused.stderr).split()
    )


def test_the_cli_writes_the_report_in_zh_tw(sqlite_engine: Engine, tmp_path: Path) -> None:
    fill(sqlite_engine, tmp_path / "artifacts")
    env = {
        **os.environ,
        "DAEDALUS_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "COLUMNS": "250",
    }
    out, page = tmp_path / "report.md", tmp_path / "report.html"
    run = subprocess.run(
        [DAEDALUS, "report", "--since", "30d", "--lang", "zh-TW", "-o", str(out), "--html", str(page)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    text = out.read_text()
    assert text.startswith("# 進度戰報") and "## 票" in text and "MTP align tax fix" in text
    assert '<html lang="zh-TW">' in page.read_text()


async def test_the_api_serves_the_report_in_zh_tw(
    api: httpx.AsyncClient,  # noqa: F811
    sqlite_engine: Engine,
    tmp_path: Path,
) -> None:
    fill(sqlite_engine, tmp_path / "artifacts")
    page = await api.get("/report", params={"lang": "zh-TW"}, headers=as_("wayne"))
    assert page.status_code == 200 and '<html lang="zh-TW">' in page.text and "<h2>戰役</h2>" in page.text
    md = await api.get("/report", params={"format": "md", "lang": "zh-TW"}, headers=as_("wayne"))
    assert "## 教訓與陷阱" in md.text and "MTP align tax fix" in md.text
    english = await api.get("/report", params={"format": "md"}, headers=as_("wayne"))
    assert "## Lessons and traps" in english.text
    wrong = await api.get("/report", params={"lang": "fr"}, headers=as_("wayne"))
    assert wrong.status_code == 422 and "use one of: en, zh-TW" in wrong.text
