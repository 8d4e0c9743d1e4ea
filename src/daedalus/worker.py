"""Assemble Temporal workers: the control queue (workflows, store) and one queue per GPU host."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from sqlalchemy import Engine
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from daedalus.activities.attempts import AttemptActivities
from daedalus.activities.audit import AuditActivities
from daedalus.activities.builds import BuildActivities
from daedalus.activities.campaigns import CampaignCellActivities, CampaignStoreActivities
from daedalus.activities.confined import ConfinedSteps
from daedalus.activities.engines import EngineActivities
from daedalus.activities.gates import GateActivities
from daedalus.activities.hosts import (
    KeeperStoreActivities,
    LeaseActivities,
    LeasedCommandActivities,
    TenantActivities,
)
from daedalus.activities.lessons import LessonActivities
from daedalus.activities.notify import NotifyActivities
from daedalus.activities.report import ReportActivities
from daedalus.activities.training import TrainingActivities
from daedalus.activities.workspace import Workspace
from daedalus.agents.settings import AgentSettings
from daedalus.config import Settings
from daedalus.confinement import StepSettings
from daedalus.engines import paths
from daedalus.engines.paths import EngineSettings
from daedalus.errors import RegistryError, SetupError
from daedalus.hosts.registry import load_registry
from daedalus.ids import host_queue
from daedalus.schemas.steps import ResourceLimits
from daedalus.slack.settings import SlackSettings
from daedalus.store.database import session_scope
from daedalus.store.seals import AuditKey, seal_unsealed
from daedalus.workflows.campaign import CampaignWorkflow
from daedalus.workflows.lease_keeper import LeaseKeeperWorkflow
from daedalus.workflows.leased_step import LeasedStepWorkflow
from daedalus.workflows.question import QuestionWorkflow
from daedalus.workflows.report_digest import ReportDigestWorkflow
from daedalus.workflows.runner import ContextFreeRunner, ignores_context
from daedalus.workflows.ticket import TicketWorkflow
from daedalus.workflows.training import TrainingRunWorkflow

log = structlog.get_logger(__name__)

YOUNG_OBJECTS_PER_COLLECTION = 10_000
"""Python's cyclic collector runs its young generation every 700 net allocations by default, and every hundredth
run is a full collection that walks every live object: with 1,000 parked tickets cached that was a 200-400 ms
pause, more with more parked (all of it stalls the worker's threads, decisions included). Fewer young runs make
full ones rarer; a young run of 10,000 objects took 3.6 ms at the median in `bench/lifecycle.py` (18 at most)."""


def settle_heap() -> None:
    """For a process that runs workers until stopped, once they are built: what it has loaded (modules, workflow
    definitions, schemas) moves out of the collector's sight for good (`gc.freeze`), so a full collection walks
    only what came later, and full collections come less often (YOUNG_OBJECTS_PER_COLLECTION)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS_PER_COLLECTION, older, oldest)


WORKFLOWS: Sequence[type] = (
    TicketWorkflow,
    TrainingRunWorkflow,
    LeaseKeeperWorkflow,
    LeasedStepWorkflow,
    ReportDigestWorkflow,
    CampaignWorkflow,
    QuestionWorkflow,
)


@dataclass(frozen=True)
class WorkerConfig:
    """What the workers and their activities are built with; the activities get their parts from here, at
    construction, and never read the environment themselves."""

    control_queue: str
    hosts: Sequence[str]
    workspace_root: Path
    artifacts: Path
    max_concurrent_activities: int = 50
    max_cached_workflows: int = 1000
    """Workflows the control worker keeps in memory; a workflow not in it is rebuilt from its history (a replay)
    when it next has work: a decision on one of more parked tickets than this pays that replay."""
    sandboxed: bool = True
    """Workflow code runs in Temporal's sandbox (settings: `temporal.sandbox`)."""
    slack: SlackSettings = field(default_factory=SlackSettings)
    """The default has no token: notifications are off (tests never reach Slack)."""
    agent: AgentSettings = field(default_factory=AgentSettings)
    engines: EngineSettings | None = None
    """The engine cache; None leaves the process's as its entry point configured it (a test session's)."""
    steps: StepSettings = field(default_factory=StepSettings)
    """How builds and gates run confined: extra read-only paths, default limits, the cgroup root."""
    audit_key: AuditKey | None = None
    """What the control worker seals audit events with (store/seals.py); required where a store is written."""
    fail_workflows_on_bugs: bool = False
    """Tests set this so a workflow bug fails the run at once instead of retrying its task forever."""
    hosts_file: Path | None = None
    """The host registry: the report digest names the tickets stuck on a host no worker polls (None: it does not)."""
    inactive_patches: frozenset[str] = frozenset()
    """`workflow.patched` ids this worker does not switch on for new workflows (they keep the old commands): during
    a rolling deploy, until every worker knows the patch; and for measuring a change against the code before it."""

    @classmethod
    def from_settings(cls, settings: Settings, hosts: Sequence[str]) -> WorkerConfig:
        return cls(
            control_queue=settings.temporal.control_queue,
            hosts=hosts,
            workspace_root=settings.home / "hosts",
            artifacts=settings.artifact_dir,
            slack=settings.slack,
            agent=settings.agent,
            engines=settings.engines,
            steps=settings.steps,
            audit_key=settings.audit_key(create=True),
            max_cached_workflows=settings.temporal.workflow_cache,
            sandboxed=settings.temporal.sandbox,
            hosts_file=settings.hosts_file,
        )


def control_worker(client: Client, config: WorkerConfig, engine: Engine) -> Worker:
    """Workflows and the activities that touch the network or the database."""
    if config.audit_key is None:
        raise SetupError(
            "the control worker writes the audit store and needs the audit key; give WorkerConfig one"
        )
    with session_scope(engine) as session:
        sealed = seal_unsealed(session, config.audit_key)
    if sealed:
        log.warning("audit_events_sealed_on_first_use", events=sealed)
    audit = AuditActivities(engine, config.audit_key)
    notify = NotifyActivities(config.slack, config.artifacts / "slack-posted")
    keepers, leases = KeeperStoreActivities(engine), LeaseActivities()
    lessons = LessonActivities(engine)
    report = ReportActivities(engine, config.slack, config.artifacts, config.hosts_file)
    campaigns = CampaignStoreActivities(engine)
    return Worker(
        client,
        task_queue=config.control_queue,
        workflows=list(WORKFLOWS),
        activities=[
            audit.record_audit_event,
            audit.record_audit_events,
            notify.notify_decision_request,
            keepers.passed_tickets,
            leases.acquire_lease,
            leases.release_lease,
            lessons.record_lessons,
            lessons.lessons_for,
            report.post_report_digest,
            campaigns.record_campaign,
        ],
        workflow_failure_exception_types=[Exception] if config.fail_workflows_on_bugs else [],
        max_concurrent_activities=config.max_concurrent_activities,
        max_cached_workflows=config.max_cached_workflows,
        workflow_runner=workflow_runner(config.sandboxed, client.data_converter),
        patch_activation_callback=(
            (lambda patch: patch.patch_id not in config.inactive_patches) if config.inactive_patches else None
        ),
    )


def workflow_runner(sandboxed: bool, converter: DataConverter) -> WorkflowRunner:
    """Temporal's runner (in its sandbox unless `temporal.sandbox` is off), wrapped so that a converter that takes
    no serialization context is not asked for one per payload (workflows/runner.py)."""
    inner = SandboxedWorkflowRunner() if sandboxed else UnsandboxedWorkflowRunner()
    return ContextFreeRunner(inner, converter) if ignores_context(converter) else inner


def gpu_state_dir(workspace_root: Path, host: str) -> Path:
    """Where a host with simulated GPUs keeps their used memory (tenant commands get it as DAEDALUS_GPU_STATE_DIR)."""
    return workspace_root / host / "gpus"


def host_limits(config: WorkerConfig, host: str) -> ResourceLimits:
    """What a confined step may use on `host`: its registry entry's limits, else the settings' default (also
    when the registry cannot be read: `daedalus host check` says so before the worker polls)."""
    if config.hosts_file is not None:
        try:
            registry = load_registry(config.hosts_file)
        except RegistryError as error:
            log.warning("step_limits_from_settings", host=host, error=str(error))
            return config.steps.limits
        if host in registry.names and (limits := registry.host(host).limits) is not None:
            return limits
    return config.steps.limits


def host_worker(client: Client, config: WorkerConfig, host: str) -> Worker:
    """The activities that run on `host` itself: agents in worktrees, builds, gates, engines, training."""
    workspace = Workspace(root=config.workspace_root / host, artifacts=config.artifacts)
    limits = host_limits(config, host)
    confined = ConfinedSteps(workspace, config.steps, limits)
    attempts, builds, gates = (
        AttemptActivities(workspace, config.agent, limits, config.steps.cgroup_root),
        BuildActivities(confined),
        GateActivities(confined),
    )
    if config.engines is not None:
        paths.configure(config.engines)
    engines = EngineActivities(config.artifacts)
    training = TrainingActivities(
        config.artifacts,
        state_dir=config.workspace_root / host / "training",
        steps=config.steps,
        limits=limits,
    )
    tenants = TenantActivities(gpu_state_dir(config.workspace_root, host))
    leased = LeasedCommandActivities(config.artifacts)
    cells = CampaignCellActivities(config.artifacts)
    return Worker(
        client,
        task_queue=host_queue(host),
        activities=[
            attempts.run_attempt,
            builds.run_build,
            gates.run_gate,
            engines.build_engine,
            engines.run_benchmark,
            engines.run_quality_probe,
            training.supervise_training,
            training.training_host_report,
            training.evaluate_checkpoint,
            training.deploy_checkpoint,
            tenants.pause_tenant,
            tenants.resume_tenant,
            leased.run_leased,
            cells.measure_campaign_cell,
        ],
        max_concurrent_activities=config.max_concurrent_activities,
    )


def build_workers(client: Client, config: WorkerConfig, engine: Engine | None) -> list[Worker]:
    """The control worker (when a store engine is given) plus one worker per host."""
    workers = [host_worker(client, config, host) for host in config.hosts]
    if engine is not None:
        workers.insert(0, control_worker(client, config, engine))
    return workers
