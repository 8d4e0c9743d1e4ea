"""Render the report as Markdown (terminal, Slack, files) and as one self-contained HTML page.

The HTML page has no external reference at all: the CSS is inline and the charts are inline SVG, so it opens
offline, from a file or an email attachment, and prints legibly. Titles, notes, lessons and labels are other
people's text: the Markdown they become renders no raw HTML, no image and no link (a title's
`![x](https://...)` would make every reader's browser fetch it), and the page's Content-Security-Policy lets
it load nothing from anywhere, should anything slip through. Control characters are shown as escapes.
"""

from __future__ import annotations

import html

from markdown_it import MarkdownIt

from daedalus.escaping import plain
from daedalus.report.i18n import _, language
from daedalus.report.model import Report
from daedalus.report.parts import Section
from daedalus.report.sections import sections

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "Noto Sans CJK TC", "PingFang TC",
       "Microsoft JhengHei", sans-serif; color: #1f2328; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
.meta { color: #57606a; }
.cards { display: flex; flex-wrap: wrap; gap: .6em; margin: 1em 0; }
.card { border: 1px solid #d0d7de; border-left-width: 6px; border-radius: 6px; padding: .5em .8em;
        min-width: 14em; max-width: 22em; }
.card .subject { font-weight: 600; } .card.pass { border-left-color: #1a7f37; }
.card.fail { border-left-color: #cf222e; } .card.wait { border-left-color: #9a6700; }
.card.info { border-left-color: #0969da; }
table { border-collapse: collapse; margin: .6em 0; font-size: .92em; }
th, td { border: 1px solid #d0d7de; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
blockquote { border-left: 4px solid #d0d7de; margin: 0; padding: 0 1em; color: #57606a; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
figcaption { color: #57606a; font-size: .9em; }
th, td { overflow-wrap: anywhere; }
@page { size: A4; margin: 12mm; }
@media print {
  body { max-width: none; margin: 0; font-size: 10pt; }
  h1, h2, h3, h4 { break-after: avoid; }
  figure, tr, li, .card { break-inside: avoid; }
  thead { display: table-header-group; }
  table { font-size: 8.5pt; }
}
"""
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)
"""Nothing is fetched, run or submitted: inline CSS and SVG only."""
STORED_TEXT_RULES = ["html_block", "html_inline", "image", "link", "autolink", "linkify"]
"""Markdown rules that would let stored text load or point at something outside the page."""


def markdown_renderer() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False}).enable("table").disable(STORED_TEXT_RULES, True)


def title(report: Report) -> str:
    return _("Progress report — since {since} UTC").format(since=f"{report.since:%Y-%m-%d %H:%M}")


def render_markdown(report: Report) -> str:
    """The report as Markdown, in the language it was built in (Report.lang)."""
    with language(report.lang):
        out = [f"# {title(report)}", ""]
        out += _narrative(report)
        for section in sections(report, with_charts=False):
            out += [f"## {section.title}", "", section.markdown, ""]
    return plain("\n".join(out).rstrip()) + "\n"


def render_html(report: Report) -> str:
    """The report as one self-contained page, in the language it was built in (Report.lang)."""
    with language(report.lang):
        return _render_html(report)


def _render_html(report: Report) -> str:
    md = markdown_renderer()
    heading = title(report)
    generated = _("generated {at} UTC from the Daedalus store").format(
        at=f"{report.generated_at:%Y-%m-%d %H:%M}"
    )
    body = [f"<h1>{html.escape(heading)}</h1>", f'<p class="meta">{html.escape(generated)}</p>']
    narrative = _narrative(report)
    if narrative:
        body.append(md.render("\n".join(narrative)))
    body.append(_cards_html(report))
    for section in sections(report):
        body.append(_section_html(md, section))
    return (
        f'<!doctype html>\n<html lang="{report.lang}"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(heading)}</title><style>{CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def _narrative(report: Report) -> list[str]:
    """The lead's narrative: optional, quoted, and labelled; the sections below are the facts."""
    if not report.narrative:
        return []
    out = [*(f"> {line}" for line in report.narrative), ""]
    if report.narrative_note:
        out += [f"_{report.narrative_note}_", ""]
    return out


def _cards_html(report: Report) -> str:
    cards = "".join(
        f'<div class="card {c.tone}"><div class="subject">{html.escape(c.subject)}</div>'
        f'<div class="state">{html.escape(c.state)}</div></div>'
        for c in report.cards
    )
    return f'<div class="cards" id="cards">{cards}</div>'


def _section_html(md: MarkdownIt, section: Section) -> str:
    body = "".join(
        md.render(part.markdown)
        + "".join(
            f'<figure class="chart" data-kind="{c.kind}" role="img" aria-label="{html.escape(c.caption)}">'
            f"{c.svg}<figcaption>{html.escape(c.caption)}</figcaption></figure>"
            for c in part.charts
        )
        for part in section.parts
    )
    return f'<section id="{section.anchor}"><h2>{html.escape(section.title)}</h2>{body}</section>'
