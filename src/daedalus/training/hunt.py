"""The hunting ticket a training run opens after its counted deaths: its id, its spec, and the deaths side by side.

Pure (schemas only): the training workflow builds the ticket from these and starts it as a child.
"""

from __future__ import annotations

from daedalus.schemas.ticket import AgentSpec, TicketKind, TicketSpec
from daedalus.schemas.training import Death, TrainingRunSpec


def hunting_ticket_id(run: str, escalation: int) -> str:
    """Deterministic per escalation, so a replay, a duplicated report or a restarted worker never opens two."""
    return f"hunt-{run}-{escalation}"


def deaths_side_by_side(deaths: list[Death]) -> str:
    """The deaths as the seed's table: run, outcome, cause, with the evidence's paths."""
    lines = [
        "| incarnation | class | lived | min available | slope | cause | evidence |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in deaths:
        avail = f"{d.min_available_gib:.1f} GiB" if d.min_available_gib is not None else "-"
        slope = f"{d.slope_gib_per_h:+.2f} GiB/h" if d.slope_gib_per_h is not None else "-"
        lines.append(
            f"| {d.id} | {d.death_class.value} | {d.lifetime_s / 60:.1f} min | {avail} | {slope} | {d.summary} "
            f"| {d.curve_path or '-'}, {d.log_tail_path or '-'} |"
        )
    return "\n".join(lines)


def hunting_ticket(run: TrainingRunSpec, ticket_id: str, deaths: list[Death]) -> TicketSpec:
    """The ticket that hunts the run's repeating death, with the watchdog's evidence in its spec."""
    return TicketSpec(
        id=ticket_id,
        title=f"Hunt the repeating death of training run {run.name} on {run.host}",
        kind=TicketKind.HUNT,
        host=run.host,
        engine=run.hunt.engine,
        agent=AgentSpec(name=run.hunt.agent, model=run.hunt.model),
        spec=(
            f"Training run `{run.name}` (`{' '.join(run.command)}`) died {len(deaths)} times in a "
            f"row. Find the cause and fix it; the watchdog's evidence, side by side:\n\n"
            f"{deaths_side_by_side(deaths)}\n"
        ),
        approval=run.approval,
        constraints=["do not restart the run yourself: the decider restarts it from its escalation"],
    )
