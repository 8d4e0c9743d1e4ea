"""`daedalus demo` (what `make demo` runs): one ticket, end to end, on this machine, with no API keys.

It starts the embedded stack, builds llama.cpp from source if it is not cached, files the local ticket
modelled on ticket 4 under the demo's policy (examples/policy.yaml), lets the lead approve the dispatch on
Wayne's behalf (the policy's standing delegation, named in the spec), and prints every audit event as it
happens until the ticket closes. `--ticket examples/tickets/local-vllm-4.yaml` runs ticket 4 on vLLM's CPU build
instead (installed by `daedalus engine install vllm`).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy import Engine

from daedalus import services as tickets
from daedalus.agents.local_model import local_model
from daedalus.api.models import AuditEventPublic
from daedalus.cli import _common
from daedalus.cli._common import console, fail, run
from daedalus.cli.audit import print_audit
from daedalus.cli.tickets import print_state
from daedalus.config import Settings
from daedalus.decisions.policy import Policy, load_policy
from daedalus.errors import (
    AgentConfigError,
    DevServerError,
    EngineError,
    RequestRefused,
    SetupError,
    TicketError,
)
from daedalus.escaping import for_terminal as shown
from daedalus.hosts.registry import load_registry
from daedalus.paths import REPO_ROOT
from daedalus.ports import port_is_open
from daedalus.schemas.ticket import AgentName, Decision, DecisionKind, RepoKind, TicketSpec, TicketState
from daedalus.store import queries
from daedalus.store.database import session_scope

EXAMPLES = REPO_ROOT / "examples"
DEMO_TICKET = EXAMPLES / "tickets" / "local-4.yaml"
DEMO_REPOS = EXAMPLES / "demo"
"""The engine repos a demo ticket may name (`repo: .daedalus/demo/<name>`): each is copied from here."""
DEMO_POLICY = EXAMPLES / "policy.yaml"
"""The policy the demo runs under when DAEDALUS_POLICY_FILE names none."""
LEAD = "lead"
FILER = "demo"
"""Files the demo ticket: a filer who operates no host, so its dispatch waits for the lead's approval."""


class DemoAgent(StrEnum):
    """Who works the demo ticket (`--agent`)."""

    CODEX = "codex"
    CLAUDE = "claude"
    SCRIPTED = "scripted"


def demo(
    ticket: Annotated[
        Path,
        typer.Option("-f", "--file", "--ticket", help="the ticket to run (local-4, or local-vllm-4 on vLLM)"),
    ] = DEMO_TICKET,
    wait_for_wayne: Annotated[
        float,
        typer.Option(
            "--wait-for-wayne",
            min=0,
            help="seconds to wait for wayne's answer when the ticket escalates, then stop (it stays open)",
        ),
    ] = 600,
    agent: Annotated[
        DemoAgent | None,
        typer.Option(
            "--agent",
            help="who works the ticket: its spec's agent (the scripted one) unless given; codex or claude run "
            "the real CLI (`make agent-clis`), against the local scripted model when no API key is set",
        ),
    ] = None,
) -> None:
    """Run the local example ticket through dispatch, build, gates and close; print its audit trail."""
    settings = _common.settings()
    try:
        spec = tickets.load_spec(ticket)
    except RequestRefused as error:
        fail(str(error))
    policy_file = settings.policy_file or DEMO_POLICY
    try:
        policy = load_policy(policy_file, load_registry(settings.hosts_file))
    except SetupError as error:
        fail(str(error))
    try:
        template = demo_repo_template(spec)
    except RequestRefused as error:
        fail(str(error))
    console.rule("[bold]Daedalus demo")
    _prepare_engine(spec)
    spec = with_demo_repo(spec, settings.home, template)
    if agent is not None and spec.agent is not None:
        spec = spec.model_copy(
            update={"agent": spec.agent.model_copy(update={"name": AgentName(agent.value)})}
        )
    who = spec.agent.name.value if spec.agent else "no"
    console.print(
        f"2. the serving-config repo the {who} agent will change: {spec.engine.repo if spec.engine else '-'}"
    )
    embedded = not port_is_open(settings.temporal.port) and settings.temporal.address is None
    try:
        with local_model(spec, settings.agent) as agent_settings:
            if agent_settings is not settings.agent:
                console.print(
                    f"   no API key for {who}: the real CLI's model is the local scripted model at "
                    f"{agent_settings.anthropic_base_url} (it writes what the ticket's patch changes)"
                )
            settings = settings.model_copy(update={"agent": agent_settings})
            state = run(_drive(spec, settings, embedded, policy, policy_file, wait_for_wayne))
    except AgentConfigError as error:
        fail(str(error))
    except DevServerError as error:
        fail(str(error))
    except StillWaiting as waiting:
        fail(str(waiting))
    console.rule(f"[bold]ticket {state.spec.id} closed: {state.status.value}")


def _prepare_engine(spec: TicketSpec) -> None:
    """What the ticket's gates run: llama.cpp built from source, or vLLM's CPU build in its environment; and the
    tiny models they serve."""
    # The engine stack loads only when a command needs it.
    if spec.engine is not None and spec.engine.kind is RepoKind.VLLM:
        from daedalus.engines.hf_tiny_model import ensure_hf_model
        from daedalus.engines.vllm_env import installed_environment

        console.print(
            "1. the engine: vLLM's CPU build in its own environment (`daedalus engine install vllm`)"
        )
        try:
            env = installed_environment()
            model = ensure_hf_model("tiny-llama", environment=env)
        except EngineError as error:
            fail(str(error))
        console.print(f"   {env.vllm_version()} at {env.root}; model: {model.name}")
        return
    from daedalus.engines.measure import ensure_build
    from daedalus.engines.tiny_model import ensure_model

    console.print(
        "1. the engine: llama.cpp built from source on this CPU (cached under .cache/ after the first time)"
    )
    try:
        build = run(ensure_build())
    except EngineError as error:
        fail(f"llama.cpp build failed: {error}")
    console.print(
        f"   llama-server at {build.bin_dir}; models: {ensure_model('small').name}, {ensure_model('medium').name}"
    )


def demo_repo_template(spec: TicketSpec) -> Path:
    """The template of the engine repo a demo ticket names (`repo: .daedalus/demo/<name>`): examples/demo/<name>."""
    name = Path(spec.engine.repo).name if spec.engine is not None else ""
    template = DEMO_REPOS / name
    if spec.engine is None or Path(spec.engine.repo).parent.name != "demo" or not template.is_dir():
        known = ", ".join(sorted(p.name for p in DEMO_REPOS.iterdir() if p.is_dir()))
        raise TicketError(
            f"ticket {spec.id} is not a demo ticket: its engine repo must be .daedalus/demo/<name>, with <name> one "
            f"of the templates in {DEMO_REPOS} ({known}); got {spec.engine.repo if spec.engine else 'no engine'}"
        )
    return template


def with_demo_repo(spec: TicketSpec, home: Path, template: Path) -> TicketSpec:
    """A fresh git repo from the template under `home`/demo/, so every demo run starts from the same base commit."""
    repo = (home / "demo" / template.name).resolve()
    if repo.exists():
        shutil.rmtree(repo)
    shutil.copytree(template, repo)
    for command in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        [
            "git",
            "-c",
            "user.name=daedalus-demo",
            "-c",
            "user.email=demo@daedalus.local",
            "commit",
            "-qm",
            "base",
        ],
    ):
        subprocess.run(command, cwd=repo, check=True)
    assert spec.engine is not None
    return spec.model_copy(update={"engine": spec.engine.model_copy(update={"repo": str(repo)})})


class StillWaiting(Exception):
    """The ticket escalated and nobody answered within the demo's wait; it stays open in the store."""


async def _drive(
    spec: TicketSpec,
    settings: Settings,
    embedded: bool,
    policy: Policy,
    policy_file: Path,
    wait_for_wayne: float,
) -> TicketState:
    from daedalus.logs import route_temporal_core
    from daedalus.stack import running_stack

    route_temporal_core()
    async with running_stack(settings, hosts=[spec.host], embedded=embedded) as stack:
        where = (
            "embedded dev server (SQLite under .daedalus/)"
            if embedded
            else f"the server at {settings.temporal.target}"
        )
        console.print(f"3. Temporal: {where}; workers for the control queue and host-{spec.host}")
        handle = await tickets.file_ticket(
            stack.client,
            spec,
            queue=settings.temporal.control_queue,
            filed_by=FILER,
            policy=policy,
            store=stack.engine,
        )
        console.print(f"4. filed ticket [bold]{shown(spec.id)}[/bold] as workflow {shown(handle.id)}")
        console.print(
            f"   Temporal UI: http://localhost:{settings.temporal.ui_port}/namespaces/{settings.temporal.namespace}/workflows/{handle.id}"
        )
        console.print('   (List filter in the UI: DaedalusTicketId="' + spec.id + '")')
        assert stack.engine is not None
        result_task = asyncio.ensure_future(handle.result())
        seen = 0
        escalated: dict[str, float] = {}  # request id -> when the demo stops waiting for it
        while not result_task.done():
            seen = _print_new_events(stack.engine, handle.id, seen)
            state = await tickets.status(stack.client, spec.id)
            request = state.pending_decision
            if request is not None and request.kind is DecisionKind.DISPATCH and LEAD in request.delegates:
                console.print(
                    f"   [cyan]{LEAD}[/cyan] approves {request.id} on wayne's behalf (a standing delegation "
                    f"in {policy_file.name})"
                )
                await tickets.decide(
                    stack.client,
                    Decision(
                        request_id=request.id, option="approve", decided_by=LEAD, channel="bot", note="demo"
                    ),
                    subject=request.subject,
                    policy=policy,
                )
            elif request is not None and request.kind is DecisionKind.ESCALATION:
                if request.id not in escalated:
                    escalated[request.id] = time.monotonic() + wait_for_wayne
                    console.print(f"   [yellow]escalated to wayne[/yellow]: {shown(request.question)}")
                    console.print(
                        shown(
                            f"   answer in another terminal within {wait_for_wayne:g}s: "
                            f".venv/bin/daedalus decide {request.id} <option> --as wayne   "
                            f"(options: {', '.join(request.options)})"
                        )
                    )
                elif time.monotonic() > escalated[request.id]:
                    result_task.cancel()
                    raise StillWaiting(
                        f"ticket {spec.id} is waiting for wayne ({request.id}) and nobody answered within "
                        f"{wait_for_wayne:g}s; it stays open under {settings.home}: run `.venv/bin/daedalus up`, "
                        f"then `.venv/bin/daedalus decide {request.id} <option> --as wayne`"
                    )
            await asyncio.wait({result_task}, timeout=0.5)
        final: TicketState = result_task.result()
        _print_new_events(stack.engine, handle.id, seen)
        console.rule("status")
        print_state(final)
        console.rule("audit trail (from the store)")
        with session_scope(stack.engine) as session:
            events = queries.audit_events(session=session, ticket_id=spec.id)
            print_audit([AuditEventPublic.model_validate(event) for event in events])
        return final


def _print_new_events(engine: Engine, workflow_id: str, seen: int) -> int:
    with session_scope(engine) as session:
        events = [
            e for e in queries.audit_events(session=session, ticket_id=workflow_id.removeprefix("ticket-"))
        ]
    fresh = [e for e in events if e.seq > seen and e.workflow_id == workflow_id]
    for event in fresh:
        console.print(
            f"   [dim]{event.at:%H:%M:%S}[/dim] #{event.seq:<2} [bold]{shown(event.kind):<18}[/bold] "
            f"{shown(event.summary)}"
        )
    return max([seen, *(e.seq for e in fresh)])
