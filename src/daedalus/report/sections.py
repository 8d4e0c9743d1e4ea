"""The report's sections, in the seed's order, each as Markdown with the charts that go under it.

Markdown is the one text form: `daedalus report` prints it, and the HTML page renders the same text (with
markdown-it) and adds the charts, so the two can never say different things.
"""

from __future__ import annotations

from daedalus.report import charts
from daedalus.report.calibration import calibration_section
from daedalus.report.i18n import _, language, ngettext, word
from daedalus.report.model import CampaignView, Report, TicketView, fmt, workload_label
from daedalus.report.parts import Chart, Part, Section, cell
from daedalus.report.questions import questions_sections

MAX_ROUNDS_SHOWN = 12


def sections(report: Report, *, with_charts: bool = True) -> list[Section]:
    """The report's sections, written in its language (Report.lang)."""
    with language(report.lang):
        return _sections(report, with_charts)


def _sections(report: Report, with_charts: bool) -> list[Section]:
    out = [_cards(report), _tickets(report, with_charts)]
    if report.waiting_on_hosts:
        out.append(_waiting_on_hosts(report))
    if report.campaigns:
        out.append(_campaigns(report, with_charts))
        if (calibration := calibration_section(report)) is not None:
            out.append(calibration)
    if report.training:
        out.append(_training(report, with_charts))
    out.append(_decisions(report))
    if report.questions is not None:  # questions that belong to no ticket, standing rulings
        out += questions_sections(report.questions)
    out.append(_lessons(report))
    return out


def _cards(report: Report) -> Section:
    lines = ["| " + _("card") + " | " + _("state") + " |", "|---|---|"]
    lines += [f"| {cell(c.subject)} | {cell(c.state)} |" for c in report.cards] or [
        "| - | " + _("nothing changed") + " |"
    ]
    return Section("status", _("Status"), [Part("\n".join(lines))])


def _tickets(report: Report, with_charts: bool) -> Section:
    parts: list[Part] = []
    if not report.tickets:
        parts.append(Part(_("No ticket changed in this window.")))

    def one(view: TicketView, depth: int) -> None:
        lines: list[str] = []
        drawn: list[Chart] = []
        t = view.row
        heading = "#" * min(3 + depth, 6)
        parent = _(" (child of {parent})").format(parent=t.parent) if t.parent else ""
        ticket = _("Ticket {ticket}: {title}").format(ticket=cell(t.ticket_id), title=cell(t.title))
        lines.extend(["", f"{heading} {ticket}{parent}", ""])
        lines.append(
            ngettext(
                "Status **{status}** after {attempts} attempt; host {host}, engine {engine}, agent {agent}.",
                "Status **{status}** after {attempts} attempts; host {host}, engine {engine}, agent {agent}.",
                t.attempts,
            ).format(
                status=word(t.status),
                attempts=t.attempts,
                host=cell(t.host),
                engine=cell(t.engine or "-"),
                agent=cell(t.agent or "-"),
            )
            + (_(" Outcome: {reason}.").format(reason=cell(t.outcome_reason)) if t.outcome_reason else "")
            + (_(" Waiting for {who}.").format(who=cell(t.awaiting)) if t.awaiting else "")
            + (f" **{cell(stuck)}.**" if (stuck := report.waiting_on_hosts.get(t.ticket_id)) else "")
        )
        if view.gates:
            lines.extend(
                [
                    "",
                    "| "
                    + " | ".join(
                        [
                            _("gate"),
                            _("verdict"),
                            _("before"),
                            _("after"),
                            _("interval"),
                            _("rule"),
                            _("rounds"),
                            _("provenance"),
                        ]
                    )
                    + " |",
                    "|---|---|---|---|---|---|---|---|",
                ]
            )
            for g in view.gates:
                v = g.latest
                interval = (
                    f"[{fmt(v.ci_low)}, {fmt(v.ci_high)}] ({v.confidence:.0%})"
                    if v.ci_low is not None and v.ci_high is not None
                    else "-"
                )
                rounds = ", ".join(f"{x:.4g}" for x in v.samples[:MAX_ROUNDS_SHOWN])
                if len(v.samples) > MAX_ROUNDS_SHOWN:
                    rounds += _(" (+{count} more)").format(count=len(v.samples) - MAX_ROUNDS_SHOWN)
                if v.baseline_samples:
                    rounds += _(" vs baseline ") + ", ".join(
                        f"{x:.4g}" for x in v.baseline_samples[:MAX_ROUNDS_SHOWN]
                    )
                unit = f" {g.unit}" if g.unit else ""
                lines.append(
                    f"| {cell(v.gate)} | {word(v.verdict)} | {fmt(g.before)}{unit if g.before is not None else ''} "
                    f"| {fmt(g.after)}{unit if g.after is not None else ''} | {interval} | {cell(v.rule)} "
                    f"| {cell(rounds or '-')} | {cell(g.provenance)} |"
                )
            reasons = [
                f"- {cell(g.latest.reason)}"
                if g.latest.reason.startswith(g.latest.gate)
                else f"- {cell(g.latest.gate)}: {cell(g.latest.reason)}"
                for g in view.gates
                if g.latest.reason
            ]
            # The host's load while each gate's rounds ran (gates/contention.py), kept in its evidence.
            reasons += [
                "- "
                + _("{gate} host load: {load}").format(
                    gate=cell(g.latest.gate), load=cell(g.latest.evidence["host_load"])
                )
                for g in view.gates
                if g.latest.evidence.get("host_load")
            ]
            if reasons:
                lines.extend(["", *reasons])
            if with_charts:
                chart = charts.gate_intervals(t.ticket_id, view.gates)
                if chart is not None:
                    drawn.append(chart)
        parts.append(Part("\n".join(lines).strip(), drawn))
        for child in view.children:
            one(child, depth + 1)

    for view in report.tickets:
        one(view, 0)
    return Section("tickets", _("Tickets"), parts)


def _waiting_on_hosts(report: Report) -> Section:
    """Every ticket stuck on a host no worker polls, also one that has not changed in the window."""
    lines = [
        f"- **{cell(ticket)}**: {cell(line)}" for ticket, line in sorted(report.waiting_on_hosts.items())
    ]
    return Section("waiting-on-hosts", _("Waiting on a host no worker polls"), [Part("\n".join(lines))])


def _campaigns(report: Report, with_charts: bool) -> Section:
    parts = []
    for campaign in report.campaigns:
        chart = charts.campaign_heatmap(campaign) if with_charts else None
        parts.append(Part("\n".join(_campaign_table(campaign)), [chart] if chart is not None else []))
    return Section("campaigns", _("Campaigns"), parts)


def _campaign_table(campaign: CampaignView) -> list[str]:
    row = campaign.row
    prov = ", ".join(f"{k} {v}" for k, v in sorted(row.provenance.items()))
    lines = [
        "### " + _("{title} ({campaign})").format(title=cell(row.title), campaign=cell(row.campaign_id)),
        "",
        _(
            "Host {host}, engine {engine}, model {model}; status **{status}**; {cells} cells, {crashed} crashed. "
            "Provenance: {provenance}."
        ).format(
            host=cell(row.host),
            engine=cell(row.engine),
            model=cell(row.model),
            status=word(row.status),
            cells=len(campaign.cells),
            crashed=len(campaign.crashed),
            provenance=cell(prov or "-"),
        ),
        "",
    ]
    # A speculative campaign's figures (acceptance, temp-0 identity vs plain) are kept in the cells' evidence.
    speculative = any(
        "acceptance_length" in c.evidence or "identity_total" in c.evidence for c in campaign.cells
    )
    extra = " " + _("acceptance length") + " | " + _("temp-0 identity") + " |" if speculative else ""
    # A GPU campaign's decode as a fraction of the bandwidth floor (probe_floor), kept in the evidence too.
    floored = any("floor_fraction" in c.evidence for c in campaign.cells)
    extra += " " + _("floor fraction [interval]") + " |" if floored else ""
    header = [
        _("preset"),
        _("workload"),
        _("decode tok/s (median)"),
        _("interval"),
        "KiB/token",
        _("needle"),
        _("quality"),
        "dPPL %",
    ]
    lines += [
        "| " + " | ".join(header) + " |" + extra + " " + _("eligible") + " |",
        "|---|---|---|---|---|---|---|---|"
        + ("---|---|" if speculative else "")
        + ("---|" if floored else "")
        + "---|",
    ]
    for c in campaign.cells:
        if c.outcome == "crashed":
            figure, interval = word("crashed") + f": {c.detail}", "-"
        elif c.outcome == "invalid":
            figure, interval = word("invalid") + f": {c.detail}", "-"
        else:
            figure = fmt(c.decode_tps)
            interval = f"[{fmt(c.ci_low)}, {fmt(c.ci_high)}]" if c.ci_low is not None else "-"
        needle = f"{c.needle_found}/{c.needle_total}" if c.needle_total else "-"
        if c.needle_lower is not None:
            needle += f" (>= {c.needle_lower:.2f})"
        columns = ""
        if speculative:
            accepted = c.evidence.get("acceptance_length")
            identity = (
                f"{c.evidence['identity_passed']}/{c.evidence['identity_total']}"
                if "identity_total" in c.evidence
                else "-"
            )
            columns = f" {fmt(float(accepted)) if accepted else '-'} | {identity} |"
        if floored:
            columns += f" {floor_cell(c.evidence)} |"
        quality = c.garbage or (_("clean") if c.outcome == "measured" else "-")
        eligible = _("yes") if c.feasible else _("no")
        lines.append(
            f"| {cell(c.label)} | {cell(workload_label(c))} | {cell(figure)} | {interval} | {fmt(c.kib_per_token)} "
            f"| {needle} | {cell(quality)} "
            f"| {fmt(c.ppl_delta_pct)} |{columns} {eligible} |"
        )
    lines += [
        "",
        _("Proposed: **{proposal}** — {reason}").format(
            proposal=cell(row.proposal), reason=cell(row.proposal_reason)
        )
        if row.proposal
        else _("Proposed: nothing — {reason}").format(
            reason=cell(row.proposal_reason) if row.proposal_reason else _("not closed yet")
        ),
    ]
    return lines


def floor_cell(evidence: dict[str, str]) -> str:
    """`0.391 [0.385, 0.397]` from a cell's stored floor figures, `-` without them."""
    if "floor_fraction" not in evidence:
        return "-"
    low, high = evidence.get("floor_ci_low"), evidence.get("floor_ci_high")
    interval = f" [{float(low):.3f}, {float(high):.3f}]" if low and high else ""
    return f"{float(evidence['floor_fraction']):.3f}{interval}"


def _training(report: Report, with_charts: bool) -> Section:
    header = [_("run"), _("state"), _("deaths"), _("fitted slope (GiB/h)"), _("last death")]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|---|---|"]
    drawn: list[Chart] = []
    for run in report.training:
        last = run.deaths[-1].event.summary if run.deaths else "-"
        lines.append(
            f"| {cell(run.run)} | {word(run.state)} | {len(run.deaths)} | {fmt(run.slope, 3)} | {cell(last)} |"
        )
    for run in report.training:
        progress = run.progress
        if progress is not None:
            summary, event = progress
            lines += [
                "",
                _("**{run}** progress: {summary} (as of {at})").format(
                    run=cell(run.run), summary=cell(summary), at=f"{event.at:%Y-%m-%d %H:%M}"
                ),
            ]
        if run.evaluations:
            lines += ["", _("**{run}** checkpoints evaluated:").format(run=cell(run.run)), ""]
            lines += [f"- {cell(e.summary)}" for e in run.evaluations]
        if run.deployments:
            lines += ["", _("**{run}** deployments:").format(run=cell(run.run)), ""]
            lines += [
                f"- {cell(e.summary)} ({cell(e.actor)}, {e.at:%Y-%m-%d %H:%M}"
                + (
                    _(", commit {commit}").format(commit=cell(e.detail["commit"][:12]))
                    if e.detail.get("commit")
                    else ""
                )
                + ")"
                for e in run.deployments
            ]
        if not run.deaths:
            continue
        lines += ["", _("**{run}** deaths:").format(run=cell(run.run)), ""]
        for death in run.deaths:
            d = death.event.detail
            lines.append(
                f"- {cell(death.death_id)} — {cell(death.death_class)}"
                + _(", ")
                + _(
                    "lived {lifetime} s, min available {available} GiB, slope {slope} GiB/h, "
                    "last checkpoint {checkpoint}; {note}"
                ).format(
                    lifetime=cell(d.get("lifetime_s", "-")),
                    available=cell(d.get("min_available_gib", "-")),
                    slope=fmt(death.slope, 3),
                    checkpoint=cell(d.get("last_checkpoint", "-")),
                    note=cell(death.curve_note),
                )
            )
        if with_charts:
            chart = charts.memory_curves(run)
            if chart is not None:
                drawn.append(chart)
    return Section("training", _("Training runs"), [Part("\n".join(lines), drawn)])


def _decisions(report: Report) -> Section:
    lines = ["### " + _("Waiting"), ""]
    lines += [
        f"- **{cell(r.request_id)}** "
        + _("({deciders}, since {since}): {question} — options {options}").format(
            deciders=cell(", ".join(r.deciders)),
            since=f"{r.requested_at:%Y-%m-%d %H:%M}",
            question=cell(r.question),
            options=cell(", ".join(r.options)),
        )
        for r in report.pending
    ] or ["- " + _("nothing")]
    lines += ["", "### " + _("Decided in this window"), ""]
    lines += [
        f"- **{cell(r.request_id)}**: "
        + _("{question} → **{option}** by {who} via {channel}").format(
            question=cell(r.question),
            option=cell(r.option),
            who=cell(r.decided_by),
            channel=cell(r.channel or "-"),
        )
        + (f" — “{cell(r.note)}”" if r.note else "")
        for r in report.decided
    ] or ["- " + _("nothing")]
    return Section("decisions", _("Decisions"), [Part("\n".join(lines))])


def _lessons(report: Report) -> Section:
    if not report.lessons:
        return Section(
            "lessons", _("Lessons and traps"), [Part(_("No lesson or trap was recorded in this window."))]
        )
    header = [_("kind"), _("subject"), _("lesson"), _("source"), _("recorded")]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|---|---|"]
    for lesson in report.lessons:
        lines.append(
            f"| {word(lesson.kind)} | {word(lesson.subject_kind)} {cell(lesson.subject)} | {cell(lesson.text)} "
            f"| {cell(lesson.source or '-')} | {lesson.recorded_at:%Y-%m-%d} |"
        )
    return Section("lessons", _("Lessons and traps"), [Part("\n".join(lines))])
