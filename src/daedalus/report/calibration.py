"""The calibration table (the seed's section 4): one workload across engines and modes, AR against speculative.

A campaign that sweeps several base presets (`axes.preset`, one per engine) is a calibration: each row is one
engine preset at one tensor-parallel size, its plain (AR) cell beside its speculative cell, the change between
them, the measured step time, and the bandwidth floor where the host has one (a GPU cell's floor_fraction; a CPU
host has none, and the row says so rather than leave a blank that reads as unmeasured).
"""

from __future__ import annotations

from daedalus.report.i18n import N_, _, word
from daedalus.report.model import CampaignView, Report, fmt
from daedalus.report.parts import Part, Section, cell
from daedalus.store.tables import CampaignCellRow

HEADER = [
    N_("calibration"),
    N_("AR tok/s (90% CI)"),
    N_("speculative tok/s (90% CI)"),
    N_("speculative vs AR"),
    N_("step time AR"),
    N_("step time speculative"),
    N_("bandwidth floor"),
]


def calibration_section(report: Report) -> Section | None:
    """One table per calibration campaign (a campaign over more than one base preset); None when there is none."""
    parts = [Part("\n".join(table(c))) for c in report.campaigns if is_calibration(c)]
    return Section("calibration", _("Calibration: AR vs speculative per engine"), parts) if parts else None


def is_calibration(campaign: CampaignView) -> bool:
    return len({c.axes.get("preset") for c in campaign.cells if c.axes.get("preset")}) > 1


def table(campaign: CampaignView) -> list[str]:
    row = campaign.row
    lines = [
        "### "
        + _("{title} ({campaign}) on {host}").format(
            title=cell(row.title), campaign=cell(row.campaign_id), host=cell(row.host)
        ),
        "",
        _(
            "Same workload in every cell; AR = plain decoding, speculative = the campaign's drafting. Step time: "
            "ms per token for AR, ms per verification step (tokens per step x ms per token) for speculative."
        ),
        "",
        "| " + " | ".join(_(h) for h in HEADER) + " |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[CampaignCellRow]] = {}
    for c in campaign.cells:
        groups.setdefault((c.axes.get("preset", ""), c.axes.get("tensor_parallel", "1")), []).append(c)
    for (preset, tp), cells in groups.items():
        plain = [c for c in cells if "speculative_k" not in c.axes]
        drafted = [c for c in cells if "speculative_k" in c.axes]
        ar = plain[0] if plain else None
        speculative: list[CampaignCellRow | None] = [*drafted] if drafted else [None]
        for spec in speculative:
            mode = (
                f"k {spec.axes['speculative_k']}"
                + (f", lookup {spec.axes['lookup']}" if "lookup" in spec.axes else "")
                if spec is not None
                else ""
            )
            lines.append(
                f"| {cell(preset)}, TP{tp}{' (' + cell(mode) + ')' if mode else ''} | {_tps(ar)} | {_tps(spec)} | "
                f"{_change(ar, spec)} | {_step(ar)} | {_step(spec)} | {_floor(ar, spec)} |"
            )
    return lines


def _tps(c: CampaignCellRow | None) -> str:
    if c is None:
        return "-"
    if c.outcome != "measured" or c.decode_tps is None:
        return f"{word(c.outcome)}: {cell(c.detail)[:160]}"
    return f"{fmt(c.decode_tps)} ({fmt(c.ci_low)}-{fmt(c.ci_high)})"


def _change(ar: CampaignCellRow | None, spec: CampaignCellRow | None) -> str:
    if ar is None or spec is None or ar.outcome != "measured" or spec.outcome != "measured":
        return "-"
    if not ar.decode_tps or spec.decode_tps is None:
        return "-"
    return f"{(spec.decode_tps / ar.decode_tps - 1) * 100:+.0f}%"


def _step(c: CampaignCellRow | None) -> str:
    """Measured step time: ms per token for plain decoding; for speculation, ms per verification step from its
    measured tokens per step (acceptance length), else per token with the step unknown."""
    if c is None or c.outcome != "measured" or not c.decode_tps:
        return "-"
    per_token = 1000.0 / c.decode_tps
    if "speculative_k" not in c.axes:
        return f"{per_token:.3g} ms"
    accepted = c.evidence.get("acceptance_length")
    if accepted is None:
        return _("{ms} ms/token (tokens per step not reported by this engine)").format(ms=f"{per_token:.3g}")
    return _("{ms} ms ({tokens} tokens/step)").format(
        ms=f"{float(accepted) * per_token:.3g}", tokens=f"{float(accepted):.3g}"
    )


def _floor(ar: CampaignCellRow | None, spec: CampaignCellRow | None) -> str:
    fractions = [c.evidence.get("floor_fraction") for c in (ar, spec) if c is not None]
    shown = [f"{float(f):.2f}" for f in fractions if f is not None]
    if shown:
        return _("{fractions} of the floor").format(fractions=" / ".join(shown))
    return _("none: a CPU host has no bandwidth floor here")
