"""What a ticket will run on its host, as a dispatch request shows it: the filing's policy (policy.py) and the
ticket's own dispatch question (workflows/ticket_rules.py) list the same lines. Pure: no Temporal, no I/O."""

from __future__ import annotations

from daedalus.schemas.ticket import AgentName, TicketSpec


def ticket_commands(spec: TicketSpec) -> list[str]:
    """What one ticket will run on its host (agent, build, gates) and where, as a dispatch request shows it.
    Every one of them runs confined (daedalus.sandbox): in the attempt's private checkout, the only place it
    may write, with no secrets and no network but an agent's model endpoint."""
    where = f"ticket {spec.id} on {spec.host}"
    checkout = (
        f"a private checkout of {spec.engine.repo} at {spec.engine.base_commit}"
        if spec.engine is not None
        else "an empty directory of the attempt"
    )
    lines = []
    if spec.agent is not None:
        agent = spec.agent
        if agent.name is AgentName.SCRIPTED:
            patch = (
                f"applies a {len(agent.patch.splitlines())}-line patch" if agent.patch else "applies no patch"
            )
            runs = f", then runs: {' && '.join(agent.commands)}" if agent.commands else ""
            lines.append(f"{where}: scripted agent {patch} in {checkout}, no network{runs}")
        else:
            model = f" (model {agent.model})" if agent.model else ""
            budget = f", budget ${agent.budget_usd:g}" if agent.budget_usd is not None else ""
            lines.append(
                f"{where}: agent {agent.name.value}{model} works in {checkout}; its network reaches its model "
                f"endpoint only{budget}"
            )
    confined = f"in {checkout}; no network, no secrets, no GPU but those leased to it"
    if spec.build is not None:
        lines.append(f"{where}: build ({confined}): {spec.build.command}")
    lines.extend(f"{where}: gate {gate.name} ({confined}): {gate.command}" for gate in spec.gates)
    if spec.engine is not None and spec.allowed_paths != ["."]:
        lines.append(f"{where}: the attempt may change only {', '.join(spec.allowed_paths)}")
    return lines


def tree_commands(spec: TicketSpec) -> list[str]:
    """What a ticket and all its sub-tickets will run."""
    return [line for ticket in spec.tree() for line in ticket_commands(ticket)]
