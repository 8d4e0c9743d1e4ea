"""Text that came from someone else (titles, summaries, notes, agent output), made safe to show.

A terminal must not obey what a ticket title says: rich markup (`[/bold]`), ANSI and OSC escape sequences,
NUL and bidirectional overrides are shown as visible escapes. Slack must not either: `&`, `<` and `>` are
escaped so a title cannot `<!channel>` or disguise a link.
"""

from __future__ import annotations

import re

from rich.markup import escape as escape_markup

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 and C1 controls (ESC starts ANSI and OSC sequences) except tab and newline; bidi overrides."""


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(text: object) -> str:
    """`text` with every control character shown as a visible escape (`\\x1b`), nothing else changed."""
    return _CONTROL.sub(_visible, str(text))


def for_terminal(text: object) -> str:
    """`text` for a rich console: control characters made visible, markup escaped."""
    return escape_markup(plain(text))  # rich's escape also doubles a trailing backslash


def for_slack(text: object) -> str:
    """`text` for Slack mrkdwn: the three characters Slack asks to escape, and control characters."""
    return plain(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
