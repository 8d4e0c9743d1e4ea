"""The report's languages: English (the source text) and Traditional Chinese, from a committed catalogue.

Every fixed word of the report (headings, table headers, phrases, verdict and status words) is written in
English in the code as a gettext message (`_`, `ngettext`, `N_` for words looked up later); the translations are
in locale/<language>/LC_MESSAGES/report.po, compiled beside it to report.mo (`pybabel compile`), which the
standard library's gettext reads when first needed. Nothing is translated at run time
by a machine: a message missing from the catalogue stays English, and tests/report/test_languages.py fails on one.
Data (titles, notes, commands, names, numbers) is never translated.

The language is a context variable, set by `language()` around building and rendering one report, so the section
functions need no parameter for it (asyncio.to_thread copies the context into the worker thread).
"""

from __future__ import annotations

import gettext as _gettext
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from pathlib import Path

LOCALE_DIR = Path(__file__).with_name("locale")
DOMAIN = "report"
LANGUAGES = {"en": "English", "zh-TW": "繁體中文 (Traditional Chinese)"}
"""The report's languages, as `--lang` and `?lang=` take them (BCP 47 tags), with their names."""
DEFAULT = "en"

_current: ContextVar[str] = ContextVar("report_language", default=DEFAULT)


class UnknownLanguage(ValueError):
    """A language the report has no catalogue for."""

    def __init__(self, lang: str) -> None:
        super().__init__(f"unknown report language {lang!r}; use one of: {', '.join(LANGUAGES)}")
        self.lang = lang


def check_language(lang: str) -> str:
    """`lang` if the report is written in it; else UnknownLanguage naming the known ones."""
    if lang not in LANGUAGES:
        raise UnknownLanguage(lang)
    return lang


def po_path(lang: str) -> Path:
    """zh-TW -> locale/zh_TW/LC_MESSAGES/report.po (gettext's directory names use an underscore)."""
    return LOCALE_DIR / lang.replace("-", "_") / "LC_MESSAGES" / f"{DOMAIN}.po"


def mo_path(lang: str) -> Path:
    """The compiled catalogue beside the .po (`pybabel compile`; tests hold it to the .po)."""
    return po_path(lang).with_suffix(".mo")


@cache
def translations(lang: str) -> _gettext.NullTranslations:
    """The catalogue of `lang` (English is the source: no catalogue), read with the standard library's gettext
    from the committed .mo, so a host renders the report with no translation package installed."""
    if check_language(lang) == DEFAULT:
        return _gettext.NullTranslations()
    with mo_path(lang).open("rb") as compiled:
        return _gettext.GNUTranslations(compiled)


@contextmanager
def language(lang: str) -> Iterator[str]:
    """Write the report in `lang` inside the block (checked: UnknownLanguage for an unknown one)."""
    translations(check_language(lang))
    token = _current.set(lang)
    try:
        yield lang
    finally:
        _current.reset(token)


def current() -> str:
    return _current.get()


def _(message: str) -> str:
    """The message in the current language."""
    return translations(_current.get()).gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    return translations(_current.get()).ngettext(singular, plural, n)


def N_(message: str) -> str:
    """Marks a message for the catalogue without translating it here (a word looked up later with `word`)."""
    return message


WORDS = {
    # verdicts
    N_("PASS"),
    N_("FAIL"),
    N_("INCONCLUSIVE"),
    N_("INVALID"),
    # ticket statuses
    N_("draft"),
    N_("awaiting_approval"),
    N_("running_children"),
    N_("dispatched"),
    N_("building"),
    N_("gating"),
    N_("awaiting_decision"),
    N_("passed"),
    N_("failed"),
    N_("closed_under_exception"),
    N_("stopped_by_rules"),
    N_("cancelled"),
    N_("terminated"),
    # campaign and training states, cell outcomes, lesson kinds
    N_("running"),
    N_("closed"),
    N_("adopted"),
    N_("rejected"),
    N_("unknown"),
    N_("gave_up"),
    N_("starting"),
    N_("restarting"),
    N_("stopping"),
    N_("stopped"),
    N_("finished"),
    N_("measured"),
    N_("crashed"),
    N_("invalid"),
    N_("outcome"),
    N_("trap"),
    N_("decision_note"),
    N_("engine"),
    N_("host"),
}
"""Words the store holds as values (verdicts, statuses, outcomes, kinds), translated where they are shown."""


def word(value: str) -> str:
    """A stored value shown in the current language: a known word translated, anything else as stored."""
    return _(value) if value in WORDS else value
