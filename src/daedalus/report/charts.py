"""The report's charts, drawn with matplotlib (Agg) as self-contained inline SVG: text as paths, no fonts or
network needed to view them, and vector, so they stay sharp in print."""

from __future__ import annotations

import io
import itertools
import re
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on workers and servers; must precede pyplot
import matplotlib.pyplot as plt
import numpy as np

from daedalus.report.i18n import _
from daedalus.report.model import CampaignView, GateView, TrainingView, threshold_of
from daedalus.report.parts import Chart

__all__ = ["Chart", "campaign_heatmap", "gate_intervals", "memory_curves"]

_ids = itertools.count()
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
STYLE: Any = {  # rc_context's key type is a Literal of every rc name
    "font.size": 9,  # legible at print size: figures are drawn at the width they print at
    "axes.titlesize": 10,
    "svg.fonttype": "path",
    "axes.spines.top": False,
    "axes.spines.right": False,
}
VERDICT_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "INCONCLUSIVE": "#9a6700", "INVALID": "#6e7781"}


def _svg(fig: plt.Figure) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]  # drop the XML prolog and doctype: the SVG sits inside HTML
    text = _METADATA.sub("", text)  # the RDF block names matplotlib.org; the page should reference nothing
    # Every chart reuses ids (figure_1, glyph defs): prefix them so charts sharing a page stay distinct.
    prefix = f"c{next(_ids)}-"
    text = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', text)
    text = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}{m.group(1)}"', text)
    return re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", text)


def _figure(value: float) -> str:
    """1234 -> "1,234", 56.04 -> "56", 3.14159 -> "3.14": no exponents in a cell label."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def gate_intervals(ticket_id: str, gates: list[GateView]) -> Chart | None:
    """Each gate's raw rounds, median and interval against its threshold, one panel per gate."""
    drawn = [g for g in gates if g.latest.samples]
    if not drawn:
        return None
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(drawn), 1, figsize=(6.5, 1.1 + 0.9 * len(drawn)), squeeze=False)
        for ax, gate in zip(axes[:, 0], drawn, strict=True):
            v = gate.latest
            colour = VERDICT_COLOURS.get(v.verdict, "#333333")
            rows = [("candidate", v.samples)]
            if v.baseline_samples:
                rows.append(("baseline", v.baseline_samples))
            for y, (name, samples) in enumerate(rows):
                jitter = np.linspace(-0.12, 0.12, len(samples)) if len(samples) > 1 else [0.0]
                ax.scatter(samples, [y + j for j in jitter], s=12, color="#57606a", zorder=2,
                           label="rounds" if y == 0 else None)  # fmt: skip
                if name == "baseline":
                    ax.plot([float(np.median(samples))] * 2, [y - 0.25, y + 0.25], color="#57606a", lw=2)
            if v.median is not None and not v.baseline_samples:
                low = v.ci_low if v.ci_low is not None else v.median
                high = v.ci_high if v.ci_high is not None else v.median
                ax.errorbar([v.median], [0], xerr=[[v.median - low], [high - v.median]], fmt="o",
                            color=colour, capsize=4, lw=2, zorder=3, label=f"median, {v.confidence:.0%} CI")  # fmt: skip
            rule = threshold_of(v.rule)
            if rule is not None and not v.baseline_samples:
                ax.axvline(rule[1], color="#0969da", ls="--", lw=1, label=f"threshold {rule[0]} {rule[1]:g}")
            ax.set_yticks(range(len(rows)), [name for name, _ in rows])
            ax.set_ylim(-0.6, len(rows) - 0.4)
            unit = f" ({gate.unit})" if gate.unit else ""
            ax.set_title(f"{v.gate}: {v.verdict}, {v.rule}"[:110], loc="left", color=colour)
            ax.set_xlabel(f"{v.metric}{unit}")
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        fig.tight_layout()
        caption = _("Ticket {ticket}: each gate's rounds, median and interval").format(ticket=ticket_id)
        return Chart("intervals", caption, _svg(fig))


def campaign_heatmap(campaign: CampaignView) -> Chart | None:
    """Decode tok/s per preset (rows) x workload (columns); crashed cells marked, ineligible ones hatched."""
    rows, columns = campaign.rows(), campaign.columns()
    if not rows or not columns:
        return None
    values = np.full((len(rows), len(columns)), np.nan)
    for i, label in enumerate(rows):
        for j, column in enumerate(columns):
            cell = campaign.cell(label, column)
            if cell is not None and cell.decode_tps is not None and cell.outcome == "measured":
                values[i, j] = cell.decode_tps
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.5, 1.2 + 0.45 * len(rows)))
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#d0d7de")
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, aspect="auto")
        low = float(np.nanmin(values)) if not np.all(np.isnan(values)) else 0.0
        span = (float(np.nanmax(values)) - low) if not np.all(np.isnan(values)) else 1.0
        for i, label in enumerate(rows):
            for j, column in enumerate(columns):
                cell = campaign.cell(label, column)
                if cell is None:
                    text = ""
                elif cell.outcome == "crashed":
                    text = "crashed"
                elif cell.outcome == "invalid" or cell.decode_tps is None:
                    text = "invalid"
                else:
                    text = _figure(cell.decode_tps) + ("" if cell.feasible else "\n(quality)")
                # dark text on the bright end of viridis, light text on the dark end
                bright = not np.isnan(values[i, j]) and (values[i, j] - low) > 0.6 * span
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="white" if not np.isnan(values[i, j]) and not bright else "black")  # fmt: skip
        ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
        ax.set_yticks(range(len(rows)), rows)
        fig.colorbar(image, ax=ax, label="decode tok/s (median)")
        ax.set_title(f"{campaign.row.title}: decode tok/s per cell", loc="left")
        fig.tight_layout()
        return Chart(
            "heatmap",
            _("Campaign {campaign}: decode tok/s per preset and workload; grey = no number").format(
                campaign=campaign.row.campaign_id
            ),
            _svg(fig),
        )


def memory_curves(run: TrainingView, threshold_gib: float | None = None) -> Chart | None:
    """Available host memory over each incarnation's life, ending at its death."""
    drawn = [d for d in run.deaths if d.curve]
    if not drawn:
        return None
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.5, 2.6))
        for death in drawn:
            xs = [p.minutes for p in death.curve]
            ys = [p.available_gib for p in death.curve]
            line = ax.plot(xs, ys, lw=1.2, label=f"{death.death_id}: {death.death_class}")[0]
            ax.plot([xs[-1]], [ys[-1]], marker="x", color=line.get_color(), ms=8)
        if threshold_gib is not None:
            ax.axhline(
                threshold_gib, color="#cf222e", ls="--", lw=1, label=f"stop threshold {threshold_gib:g} GiB"
            )
        ax.set_xlabel("minutes since the incarnation started")
        ax.set_ylabel("available memory (GiB)")
        slope = run.slope
        title = f"Training {run.run}: memory per incarnation"
        if slope is not None:
            title += f" (fitted slope {slope:.3g} GiB/h)"
        ax.set_title(title, loc="left")
        ax.legend(loc="best", fontsize=7, frameon=False)
        fig.tight_layout()
        caption = _("Training {run}: available memory until each death (x)").format(run=run.run)
        return Chart("memory", caption, _svg(fig))
