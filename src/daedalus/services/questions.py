"""Questions for the deciders that belong to no ticket, and the standing rulings they make, as every entry point
(CLI, HTTP API, a bot) files and reads them. Answering is `daedalus.services.decisions.decide`, as for any
subject: the request's subject (a `QuestionSubject`) routes the answer to the question's workflow.

Standing rulings are read from the store (the `ruled` events of question trails) and enforced here: a ticket
whose presets contradict one is refused at filing (`require_obeys_rulings`), and a campaign's presets that
contradict one are ruled out of its proposal (`ruled_out_presets`).
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlmodel import select
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from daedalus.decisions.policy import Policy, Role
from daedalus.decisions.questions import QuestionInput, QuestionSpec, QuestionStatus, WithdrawQuestion
from daedalus.decisions.rulings import Ruling, preset_breaks
from daedalus.engines.gate_fit import parse_measure_command, preset_at_filing
from daedalus.errors import EngineError, NotAllowed, TicketError
from daedalus.ids import question_subject_key, question_workflow_id
from daedalus.schemas.campaigns import CampaignSpec
from daedalus.schemas.ticket import TicketSpec
from daedalus.services._temporal import update
from daedalus.store.database import session_scope
from daedalus.store.questions import question_rows as question_rows
from daedalus.store.questions import standing_rulings as standing_rulings
from daedalus.store.tables import DecisionRow
from daedalus.workflows.question import QuestionWorkflow

QUESTION_FILE_BYTES = 64 * 1024


RELATIVE_DEADLINE = re.compile(r"^\+(\d{1,6})([smhd])$")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_question(data: Any, source: str = "question", *, now: datetime | None = None) -> QuestionSpec:
    """A question spec from a mapping; every problem names its field. A deadline written `+7d` (`s`, `m`, `h`,
    `d`) is that long from `now`, made absolute here: the workflow keeps the instant."""
    if not isinstance(data, dict):
        raise TicketError(
            f"{source} must be a mapping of question fields (id, question, options, deadline, ...), not "
            f"{type(data).__name__}"
        )
    deadline = data.get("deadline")
    if isinstance(deadline, str) and deadline.startswith("+"):
        found = RELATIVE_DEADLINE.match(deadline)
        if found is None:
            raise TicketError(
                f"{source}: deadline {deadline!r} is not a relative deadline; write +30m, +36h, +7d, or an instant "
                f"such as 2026-07-19T17:00:00Z"
            )
        delta = timedelta(**{UNITS[found.group(2)]: int(found.group(1))})
        data = {**data, "deadline": (now or datetime.now(UTC)) + delta}
    try:
        return QuestionSpec.model_validate(data)
    except ValidationError as error:
        lines = [f"{source} is not a valid question ({error.error_count()} problem(s)):"]
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"]) or "(top level)"
            given = problem.get("input")
            shown = "" if isinstance(given, dict | list) else f" (got {given!r})"
            lines.append(f"  - {where}: {problem['msg'].removeprefix('Value error, ')}{shown}")
        raise TicketError("\n".join(lines)) from error


def load_question(path: Path) -> QuestionSpec:
    try:
        raw = path.read_bytes()[: QUESTION_FILE_BYTES + 1]
    except OSError as error:
        raise TicketError(f"cannot read {path}: {error.strerror}") from error
    if len(raw) > QUESTION_FILE_BYTES:
        raise TicketError(f"{path} is larger than {QUESTION_FILE_BYTES // 1024} KiB; a question is short")
    try:
        data = yaml.safe_load(raw.decode(errors="replace"))
    except yaml.YAMLError as error:
        raise TicketError(f"{path} is not valid YAML: {error}") from error
    return parse_question(data, str(path))


def resolve_deciders(spec: QuestionSpec, asked_by: str, policy: Policy | None) -> list[str]:
    """Who may answer: the spec's deciders (each a decider of the policy), else every decider of the policy.
    Under a policy, the asker must be a person it knows (a filer, lead or decider; a bot files as a lead)."""
    if policy is None:
        if not spec.deciders:
            raise TicketError(
                f"question {spec.id} names no deciders and the server has no policy to take them from; add "
                f"`deciders: [wayne]`"
            )
        return list(spec.deciders)
    asker = asked_by.lower()
    if not any(policy.has_role(asker, role) for role in (Role.FILER, Role.LEAD, Role.DECIDER)):
        raise NotAllowed(
            f"{asker} may not ask questions: not a filer, lead or decider in the server's policy; if you are not "
            f"{asker}, say who you are with --as <you>"
        )
    deciders = policy.with_role(Role.DECIDER)
    strangers = [person for person in spec.deciders if person not in deciders]
    if strangers:
        raise NotAllowed(
            f"question {spec.id}: deciders names {strangers}, who are not deciders in the policy; choose among "
            f"{deciders}"
        )
    return list(spec.deciders) or deciders


def _asked_before(store: Engine, question_id: str) -> datetime | None:
    with session_scope(store) as session:
        query = select(DecisionRow.requested_at).where(
            DecisionRow.ticket_id == question_subject_key(question_id)
        )
        return session.exec(query).first()


async def ask(
    client: Client,
    spec: QuestionSpec,
    *,
    queue: str,
    asked_by: str,
    policy: Policy | None = None,
    store: Engine | None = None,
    now: datetime | None = None,
) -> WorkflowHandle[QuestionWorkflow, QuestionStatus]:
    """Start `question-<id>`; refused (nothing started) for a past or far deadline, unknown deciders, an
    asker the policy does not know, or an id asked before (a question id names one question for ever)."""
    try:
        spec.require_open_window(now or datetime.now(UTC))
    except ValueError as error:
        raise TicketError(f"question {spec.id}: {error}") from error
    deciders = resolve_deciders(spec, asked_by, policy)
    if store is not None and spec.revokes:
        standing_ids = {ruling.id for ruling in await asyncio.to_thread(read_rulings, store)}
        unknown = [ruling for ruling in spec.revokes if ruling not in standing_ids]
        if unknown:
            raise TicketError(
                f"question {spec.id}: revokes {unknown}, which are not standing rulings (standing: "
                f"{sorted(standing_ids) or 'none'}; `daedalus rulings` lists them)"
            )
    if store is not None:
        before = await asyncio.to_thread(_asked_before, store, spec.id)
        if before is not None:
            raise TicketError(
                f"question {spec.id} was asked before ({before:%Y-%m-%d %H:%M} UTC); a question id names one "
                f"question for ever: choose another id"
            )
    try:
        handle: WorkflowHandle[QuestionWorkflow, QuestionStatus] = await client.start_workflow(
            QuestionWorkflow.run,
            QuestionInput(spec=spec, asked_by=asked_by.lower(), deciders=deciders),
            id=question_workflow_id(spec.id),
            task_queue=queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            static_summary=f"question: {spec.question}"[:200],
        )
    except WorkflowAlreadyStartedError as error:
        raise TicketError(
            f"question {spec.id} was asked before (workflow {question_workflow_id(spec.id)}); choose another id"
        ) from error
    except RPCError as error:
        raise TicketError(f"Temporal refused question {spec.id}: {error.message}") from error
    return handle


async def status(client: Client, question_id: str) -> QuestionStatus:
    handle = client.get_workflow_handle(question_workflow_id(question_id))
    try:
        result: QuestionStatus = await handle.query(QuestionWorkflow.status)
        return result
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise TicketError(f"no question {question_id} in Temporal ({error.message})") from error
        raise TicketError(f"question {question_id} did not answer ({error.message})") from error


async def withdraw(client: Client, question_id: str, request: WithdrawQuestion) -> QuestionStatus:
    result: QuestionStatus = await update(
        client,
        question_workflow_id(question_id),
        f"question {question_id}",
        QuestionWorkflow.withdraw,
        request,
    )
    return result


# ---- reading the store -------------------------------------------------------------------------------------


def read_rulings(store: Engine) -> list[Ruling]:
    with session_scope(store) as session:
        return standing_rulings(session)


# ---- enforcing the rulings ---------------------------------------------------------------------------------


def ticket_breaks(spec: TicketSpec, rulings: list[Ruling]) -> list[str]:
    """Each way `spec` (and its sub-tickets) contradicts a standing ruling: the engine's preset, and every
    preset a gate measures (a gate's baseline preset is held to rulings that do not exempt baselines)."""
    if not rulings:
        return []
    problems: list[str] = []
    for ticket in spec.tree():
        seen: list[tuple[str, bool]] = []
        if ticket.engine is not None and ticket.engine.preset:
            seen.append((ticket.engine.preset, False))
        for gate in ticket.gates:
            call = parse_measure_command(gate.command)
            if call is None:
                continue
            seen.extend((ref, index > 0) for index, ref in enumerate(call.presets))
        for ref, baseline in dict.fromkeys(seen):
            preset = preset_at_filing(ref, ticket.engine)
            if preset is None:
                continue
            role = "baseline preset" if baseline else "preset"
            problems += [
                f"ticket {ticket.id} {role} {ref}: {why}"
                for why in preset_breaks(rulings, preset, baseline=baseline)
            ]
    return problems


def require_obeys_rulings(spec: TicketSpec, rulings: list[Ruling]) -> None:
    """Refuse a ticket that contradicts a standing ruling, naming the ruling; nothing is started."""
    problems = ticket_breaks(spec, rulings)
    if problems:
        raise TicketError(
            f"ticket {spec.id} contradicts standing rulings: "
            + "; ".join(problems)
            + ". Change the preset, or ask the deciders to rule again (`daedalus question ask`)"
        )


def ruled_out_presets(spec: CampaignSpec, rulings: list[Ruling]) -> dict[str, str]:
    """The campaign's cell presets a standing ruling forbids (name -> why): measured, never proposed."""
    if not rulings:
        return {}
    from daedalus.campaigns.cells import cell_preset

    out: dict[str, str] = {}
    for cell in spec.cells():
        try:
            preset = cell_preset(spec, cell)
        except (ValueError, EngineError):  # a cell that cannot be built is its own INVALID, later
            continue
        breaks = preset_breaks(rulings, preset)
        if breaks and preset.name not in out:
            out[preset.name] = breaks[0]
    return out
