"""The progress report (the seed's "battle report"), rolled up from the store — never from Temporal history.

gather (store -> model) -> sections (model -> Markdown + charts) -> render (Markdown, self-contained HTML).
"""

from daedalus.report.gather import build_report
from daedalus.report.model import Report
from daedalus.report.render import render_html, render_markdown

__all__ = ["Report", "build_report", "render_html", "render_markdown"]
