"""The report's building blocks, below every section module: a Part (Markdown and its charts), a Section, and
the table cell escape, importing nothing of the report. sections.py, calibration.py and questions.py build on these and on nothing of each other's,
so the report package has no import cycle."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Chart:
    """One drawn chart: its caption (also the alt text) and the SVG markup (drawn by charts.py)."""

    kind: str
    caption: str
    svg: str


@dataclass
class Part:
    """Markdown and the charts drawn right under it."""

    markdown: str
    charts: list[Chart] = field(default_factory=list)


@dataclass
class Section:
    anchor: str
    title: str
    parts: list[Part]

    @property
    def markdown(self) -> str:
        return "\n\n".join(p.markdown for p in self.parts if p.markdown)

    @property
    def charts(self) -> list[Chart]:
        return [c for p in self.parts for c in p.charts]


def cell(text: object) -> str:
    """A table cell: pipes and line breaks would end the cell or the row."""
    return " ".join(str(text).split()).replace("|", "\\|")
