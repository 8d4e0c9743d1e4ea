"""Run a ticket's build command in the attempt's checkout, on the ticket's host, confined (activities/confined.py)."""

from temporalio import activity

from daedalus.activities.confined import ConfinedSteps, limits_note
from daedalus.activities.refs import RUN_BUILD
from daedalus.errors import GitError, maps_errors
from daedalus.schemas.steps import BuildInput, BuildResult


class BuildActivities:
    def __init__(self, steps: ConfinedSteps):
        self.steps = steps

    @activity.defn(name=RUN_BUILD.name)
    @maps_errors
    async def run_build(self, request: BuildInput) -> BuildResult:
        """A failing build is a result (the ticket decides what it means), not an activity error."""
        artifacts = self.steps.workspace.attempt_artifacts(request.ticket_id, request.attempt)
        log = artifacts / "build.log"
        log.unlink(missing_ok=True)  # a retried build starts a fresh log
        workdir = self.steps.workspace.worktree(request.ticket_id, request.attempt)
        if not workdir.exists() and request.engine is not None:
            # A ticket without an agent builds its engine as it stands at the commit it measures.
            try:
                self.steps.workspace.check_out_as_it_stands(
                    request.ticket_id, request.attempt, request.engine, request.host
                )
            except GitError as error:
                return BuildResult(
                    ok=False, returncode=-1, log=str(log), log_tail=f"cannot check out: {error}"
                )
        finished = await self.steps.run(
            request.command,
            ticket_id=request.ticket_id,
            attempt=request.attempt,
            scratch=artifacts / "build-scratch",
            log_path=log,
            timeout_s=request.timeout_s,
            heartbeat=activity.heartbeat,
            pidfile=artifacts / "build.pid",
        )
        note = limits_note(finished)
        return BuildResult(
            ok=finished.returncode == 0 and not finished.timed_out and not finished.limits_hit,
            returncode=finished.returncode,
            timed_out=finished.timed_out,
            log=str(log),
            log_tail=(f"[{note}]\n" if note else "") + finished.tail(1500),
        )
