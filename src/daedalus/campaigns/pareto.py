"""Which presets a campaign proposes: eligibility under the quality constraints, the Pareto front, the pick.

Pure functions (the workflow calls them). A preset is one (KV type, context, k) row of cells across the user
counts; it is eligible only when every one of its cells was measured and met the constraints, so a preset that
crashed at some user count (the wall) is never proposed. On the front (more decode tok/s at its worst user count,
fewer KiB/token, more context: none dominated), the pick is the smallest KiB/token among the presets not shown
slower than the front's fastest — whose decode interval reaches within `speed_tolerance` of the fastest median —
the seed's "speed is neutral to KV dtype (earlier gaps were noise), so take the smallest KV".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from daedalus.schemas.campaigns import CampaignSpec, CellOutcome, CellResult, Proposal


def cell_ok(result: CellResult, spec: CampaignSpec, baseline: CellResult | None) -> bool:
    """A measured cell meeting the constraints; relative ones compare with the baseline KV's same cell."""
    c = spec.constraints
    if result.outcome is not CellOutcome.MEASURED or result.decode_tps is None:
        return False
    if result.needle_total:
        fraction = (result.needle_found or 0) / result.needle_total
        if fraction < c.min_needle_fraction:
            return False
        if (
            c.not_below_baseline
            and baseline is not None
            and baseline.needle_total
            and fraction < (baseline.needle_found or 0) / baseline.needle_total
        ):
            return False
    if c.forbid_garbage and result.garbage:
        extra = set(result.garbage.split(", ")) - (
            set(baseline.garbage.split(", "))
            if c.not_below_baseline and baseline is not None and baseline.garbage
            else set()
        )
        if extra:
            return False
    if (
        spec.probe_identity
        and result.cell.speculative_k
        and (result.identity_total is None or (result.identity_passed or 0) < result.identity_total)
    ):
        return (
            False  # speculation that changes temp-0 output (the seed's k=4, struck on quality), or unjudged
        )
    limit = c.max_ppl_delta_pct
    return limit is None or (result.ppl_delta_pct is not None and result.ppl_delta_pct <= limit)


def eligible_cells(spec: CampaignSpec, results: list[CellResult]) -> set[str]:
    by_key = {r.cell.key: r for r in results}
    out = set()
    for r in results:
        base = by_key.get(r.cell.model_copy(update={"kv": spec.baseline_kv}).key)
        if cell_ok(r, spec, base):
            out.add(r.cell.key)
    return out


@dataclass(frozen=True)
class PresetScore:
    preset: str
    worst_tps: float
    worst_high: float
    kib_per_token: float
    context: int
    cells: tuple[str, ...]

    def dominates(self, other: PresetScore) -> bool:
        mine = (self.worst_tps, -self.kib_per_token, self.context)
        theirs = (other.worst_tps, -other.kib_per_token, other.context)
        return all(a >= b for a, b in zip(mine, theirs, strict=True)) and mine != theirs


def propose(
    spec: CampaignSpec, results: list[CellResult], ruled_out: Mapping[str, str] | None = None
) -> tuple[Proposal, set[str]]:
    """The proposal and the eligible cell keys. A preset in `ruled_out` (a standing ruling forbids it) is never
    eligible, whatever it measured."""
    ruled_out = ruled_out or {}
    eligible = eligible_cells(spec, results) - {r.cell.key for r in results if r.preset in ruled_out}
    by_preset: dict[str, list[CellResult]] = defaultdict(list)
    for r in results:
        by_preset[r.preset].append(r)
    scores = []
    for preset, cells in by_preset.items():
        if not all(c.cell.key in eligible for c in cells):
            continue
        kibs = sorted(c.kib_per_token for c in cells if c.kib_per_token is not None)
        worst = min(cells, key=lambda c: c.decode_tps or 0.0)
        scores.append(
            PresetScore(
                preset=preset,
                worst_tps=worst.decode_tps or 0.0,
                worst_high=worst.ci_high if worst.ci_high is not None else (worst.decode_tps or 0.0),
                # unmeasured footprint (vLLM reads it from its log) ranks as unknown, i.e. last
                kib_per_token=kibs[len(kibs) // 2] if kibs else float("inf"),
                context=cells[0].cell.context,
                cells=tuple(c.cell.key for c in cells),
            )
        )
    crashed = sum(r.outcome is CellOutcome.CRASHED for r in results)
    ruled = sorted(p for p in by_preset if p in ruled_out)
    if not scores:
        why = f"no preset met the quality constraints in every cell ({crashed} cells crashed)"
        if ruled:
            why += f"; ruled out by standing rulings: {'; '.join(ruled_out[p] for p in ruled)}"
        return Proposal(reason=why), eligible
    front = [s for s in scores if not any(o.dominates(s) for o in scores)]
    fastest = max(s.worst_tps for s in front)
    near = [s for s in front if s.worst_high >= fastest * (1 - spec.speed_tolerance)]
    pick = min(near, key=lambda s: (s.kib_per_token, -s.worst_tps, -s.context))
    reason = (
        f"{pick.preset}: {pick.worst_tps:.4g} tok/s at its worst user count, "
        + (f"{pick.kib_per_token:.4g} KiB/token, " if pick.kib_per_token != float("inf") else "")
        + f"context {pick.context}; smallest KV among {len(near)} presets not shown slower than the front's "
        f"fastest ({fastest:.4g} tok/s; interval within {spec.speed_tolerance:.0%}); front: {', '.join(s.preset for s in front)}; "
        f"{len(scores)} of {len(by_preset)} presets eligible, {crashed} cells crashed"
        + (f"; ruled out by standing rulings: {', '.join(ruled)}" if ruled else "")
    )
    return Proposal(
        front=[k for s in front for k in s.cells], preset=pick.preset, cell=pick.cells[0], reason=reason
    ), eligible
