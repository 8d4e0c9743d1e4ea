"""The report's sections, in the seed's order, each as Markdown with the charts that go under it.

Markdown is the one text form: `daedalus report` prints it, and the HTML page renders the same text (with
markdown-it) and adds the charts, so the two can never say different things.
"""

from __future__ import annotations

from daedalus.report import charts
from daedalus.report.calibration import calibration_section
from daedalus.report.model import CampaignView, Report, TicketView, fmt, workload_label
from daedalus.report.parts import Chart, Part, Section, cell
from daedalus.report.questions import questions_sections

MAX_ROUNDS_SHOWN = 12


def sections(report: Report, *, with_charts: bool = True) -> list[Section]:
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
    lines = ["| card | state |", "|---|---|"]
    lines += [f"| {cell(c.subject)} | {cell(c.state)} |" for c in report.cards] or ["| - | nothing changed |"]
    return Section("status", "Status", [Part("\n".join(lines))])


def _tickets(report: Report, with_charts: bool) -> Section:
    parts: list[Part] = []
    if not report.tickets:
        parts.append(Part("No ticket changed in this window."))

    def one(view: TicketView, depth: int) -> None:
        lines: list[str] = []
        drawn: list[Chart] = []
        t = view.row
        heading = "#" * min(3 + depth, 6)
        parent = f" (child of {t.parent})" if t.parent else ""
        lines.extend(["", f"{heading} Ticket {cell(t.ticket_id)}: {cell(t.title)}{parent}", ""])
        lines.append(
            f"Status **{t.status}** after {t.attempts} attempt{'s' * (t.attempts != 1)}; host {cell(t.host)}, "
            f"engine {cell(t.engine or '-')}, agent {cell(t.agent or '-')}."
            + (f" Outcome: {cell(t.outcome_reason)}." if t.outcome_reason else "")
            + (f" Waiting for {cell(t.awaiting)}." if t.awaiting else "")
            + (f" **{cell(stuck)}.**" if (stuck := report.waiting_on_hosts.get(t.ticket_id)) else "")
        )
        if view.gates:
            lines.extend(
                [
                    "",
                    "| gate | verdict | before | after | interval | rule | rounds | provenance |",
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
                    rounds += f" (+{len(v.samples) - MAX_ROUNDS_SHOWN} more)"
                if v.baseline_samples:
                    rounds += " vs baseline " + ", ".join(
                        f"{x:.4g}" for x in v.baseline_samples[:MAX_ROUNDS_SHOWN]
                    )
                unit = f" {g.unit}" if g.unit else ""
                lines.append(
                    f"| {cell(v.gate)} | {v.verdict} | {fmt(g.before)}{unit if g.before is not None else ''} "
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
                f"- {cell(g.latest.gate)} host load: {cell(g.latest.evidence['host_load'])}"
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
    return Section("tickets", "Tickets", parts)


def _waiting_on_hosts(report: Report) -> Section:
    """Every ticket stuck on a host no worker polls, also one that has not changed in the window."""
    lines = [
        f"- **{cell(ticket)}**: {cell(line)}" for ticket, line in sorted(report.waiting_on_hosts.items())
    ]
    return Section("waiting-on-hosts", "Waiting on a host no worker polls", [Part("\n".join(lines))])


def _campaigns(report: Report, with_charts: bool) -> Section:
    parts = []
    for campaign in report.campaigns:
        chart = charts.campaign_heatmap(campaign) if with_charts else None
        parts.append(Part("\n".join(_campaign_table(campaign)), [chart] if chart is not None else []))
    return Section("campaigns", "Campaigns", parts)


def _campaign_table(campaign: CampaignView) -> list[str]:
    row = campaign.row
    prov = ", ".join(f"{k} {v}" for k, v in sorted(row.provenance.items()))
    lines = [
        f"### {cell(row.title)} ({cell(row.campaign_id)})",
        "",
        f"Host {cell(row.host)}, engine {cell(row.engine)}, model {cell(row.model)}; status **{row.status}**; "
        f"{len(campaign.cells)} cells, {len(campaign.crashed)} crashed. Provenance: {cell(prov or '-')}.",
        "",
    ]
    # A speculative campaign's figures (acceptance, temp-0 identity vs plain) are kept in the cells' evidence.
    speculative = any(
        "acceptance_length" in c.evidence or "identity_total" in c.evidence for c in campaign.cells
    )
    extra = " acceptance length | temp-0 identity |" if speculative else ""
    # A GPU campaign's decode as a fraction of the bandwidth floor (probe_floor), kept in the evidence too.
    floored = any("floor_fraction" in c.evidence for c in campaign.cells)
    extra += " floor fraction [interval] |" if floored else ""
    lines += [
        "| preset | workload | decode tok/s (median) | interval | KiB/token | needle | quality | dPPL % |"
        + extra
        + " eligible |",
        "|---|---|---|---|---|---|---|---|"
        + ("---|---|" if speculative else "")
        + ("---|" if floored else "")
        + "---|",
    ]
    for c in campaign.cells:
        if c.outcome == "crashed":
            figure, interval = f"crashed: {c.detail}", "-"
        elif c.outcome == "invalid":
            figure, interval = f"invalid: {c.detail}", "-"
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
        lines.append(
            f"| {cell(c.label)} | {cell(workload_label(c))} | {cell(figure)} | {interval} | {fmt(c.kib_per_token)} "
            f"| {needle} | {cell(c.garbage or ('clean' if c.outcome == 'measured' else '-'))} "
            f"| {fmt(c.ppl_delta_pct)} |{columns} {'yes' if c.feasible else 'no'} |"
        )
    lines += [
        "",
        f"Proposed: **{cell(row.proposal)}** — {cell(row.proposal_reason)}"
        if row.proposal
        else f"Proposed: nothing — {cell(row.proposal_reason or 'not closed yet')}",
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
    lines = ["| run | state | deaths | fitted slope (GiB/h) | last death |", "|---|---|---|---|---|"]
    drawn: list[Chart] = []
    for run in report.training:
        last = run.deaths[-1].event.summary if run.deaths else "-"
        lines.append(
            f"| {cell(run.run)} | {run.state} | {len(run.deaths)} | {fmt(run.slope, 3)} | {cell(last)} |"
        )
    for run in report.training:
        progress = run.progress
        if progress is not None:
            summary, event = progress
            lines += ["", f"**{cell(run.run)}** progress: {cell(summary)} (as of {event.at:%Y-%m-%d %H:%M})"]
        if run.evaluations:
            lines += ["", f"**{cell(run.run)}** checkpoints evaluated:", ""]
            lines += [f"- {cell(e.summary)}" for e in run.evaluations]
        if run.deployments:
            lines += ["", f"**{cell(run.run)}** deployments:", ""]
            lines += [
                f"- {cell(e.summary)} ({cell(e.actor)}, {e.at:%Y-%m-%d %H:%M}"
                + (f", commit {cell(e.detail['commit'][:12])}" if e.detail.get("commit") else "")
                + ")"
                for e in run.deployments
            ]
        if not run.deaths:
            continue
        lines += ["", f"**{cell(run.run)}** deaths:", ""]
        for death in run.deaths:
            d = death.event.detail
            lines.append(
                f"- {cell(death.death_id)} — {cell(death.death_class)}, lived {cell(d.get('lifetime_s', '-'))} s, "
                f"min available {cell(d.get('min_available_gib', '-'))} GiB, slope {fmt(death.slope, 3)} GiB/h, "
                f"last checkpoint {cell(d.get('last_checkpoint', '-'))}; {cell(death.curve_note)}"
            )
        if with_charts:
            chart = charts.memory_curves(run)
            if chart is not None:
                drawn.append(chart)
    return Section("training", "Training runs", [Part("\n".join(lines), drawn)])


def _decisions(report: Report) -> Section:
    lines = ["### Waiting", ""]
    lines += [
        f"- **{cell(r.request_id)}** ({cell(', '.join(r.deciders))}, since {r.requested_at:%Y-%m-%d %H:%M}): "
        f"{cell(r.question)} — options {cell(', '.join(r.options))}"
        for r in report.pending
    ] or ["- nothing"]
    lines += ["", "### Decided in this window", ""]
    lines += [
        f"- **{cell(r.request_id)}**: {cell(r.question)} → **{cell(r.option)}** by {cell(r.decided_by)} "
        f"via {cell(r.channel or '-')}" + (f" — “{cell(r.note)}”" if r.note else "")
        for r in report.decided
    ] or ["- nothing"]
    return Section("decisions", "Decisions", [Part("\n".join(lines))])


def _lessons(report: Report) -> Section:
    if not report.lessons:
        return Section(
            "lessons", "Lessons and traps", [Part("No lesson or trap was recorded in this window.")]
        )
    lines = ["| kind | subject | lesson | source | recorded |", "|---|---|---|---|---|"]
    for lesson in report.lessons:
        lines.append(
            f"| {lesson.kind} | {lesson.subject_kind} {cell(lesson.subject)} | {cell(lesson.text)} "
            f"| {cell(lesson.source or '-')} | {lesson.recorded_at:%Y-%m-%d} |"
        )
    return Section("lessons", "Lessons and traps", [Part("\n".join(lines))])
