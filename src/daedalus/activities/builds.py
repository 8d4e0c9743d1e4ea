"""Run a ticket's build command in the attempt's worktree, on the ticket's host."""

from temporalio import activity

from daedalus.activities.refs import RUN_BUILD
from daedalus.activities.workspace import Workspace
from daedalus.errors import maps_errors
from daedalus.processes import run_logged
from daedalus.schemas.steps import BuildInput, BuildResult


class BuildActivities:
    def __init__(self, workspace: Workspace):
        self.workspace = workspace

    @activity.defn(name=RUN_BUILD.name)
    @maps_errors
    async def run_build(self, request: BuildInput) -> BuildResult:
        """A failing build is a result (the ticket decides what it means), not an activity error."""
        artifacts = self.workspace.attempt_artifacts(request.ticket_id, request.attempt)
        log = artifacts / "build.log"
        log.unlink(missing_ok=True)  # a retried build starts a fresh log
        finished = await run_logged(
            request.command,
            cwd=self.workspace.worktree(request.ticket_id, request.attempt),
            log_path=log,
            timeout_s=request.timeout_s,
            heartbeat=activity.heartbeat,
            pidfile=artifacts / "build.pid",
        )
        return BuildResult(
            ok=finished.returncode == 0 and not finished.timed_out,
            returncode=finished.returncode,
            timed_out=finished.timed_out,
            log=str(log),
            log_tail=finished.tail(1500),
        )
