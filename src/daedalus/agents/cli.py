"""Coding agents that are programs (Codex CLI, Claude Code): spawn, stream JSONL, supervise, attach again.

The real binaries run inside the agent's sandbox, each with a home directory of its own under the attempt's
artifacts (its config, written here by Daedalus, its sessions and caches). Their only way out is their model
endpoint (`daedalus.egress`): the sandbox has no network of its own.

The agent's stdout goes straight to `events.jsonl` in the attempt's artifact dir and is tailed from there, so
a retried activity (a new worker, or the same one after a timeout) can attach to a still-running agent and
read its whole event stream instead of starting a second one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from daedalus.agents.base import (
    EVENTS_FILE,
    RUNNING_FILE,
    STDERR_FILE,
    USAGE_FILE,
    Heartbeat,
    RunningRecord,
    Throttle,
    make_result,
)
from daedalus.agents.costs import CostMeter
from daedalus.agents.prompt import build_prompt, claimed_success, reported_traps
from daedalus.agents.settings import AgentSettings
from daedalus.agents.tools import Toolbox
from daedalus.agents.worktree import objects_dir
from daedalus.confinement import Confinement
from daedalus.egress import Egress, plan_for
from daedalus.engines.paths import cache_root
from daedalus.errors import AgentConfigError, AgentViolation, BudgetExceeded, ForbiddenCommand, PathEscape
from daedalus.paths import REPO_ROOT
from daedalus.processes import end_step, kill_group, step_token
from daedalus.sandbox import Sandbox
from daedalus.schemas.agents import AgentResult, AgentTask, ExitReason

log = structlog.get_logger(__name__)
POLL_S = 0.05
EGRESS_LOG = "egress.log"
EGRESS_FILE = "egress.json"
CONFINEMENT_FILE = "confinement.json"
"""The agent's limits and the cgroup its process tree runs in: whoever ends the agent removes the cgroup."""
HOME_DIR = "home"
CLIS_LOCK = REPO_ROOT / "tools" / "agent-clis" / "package-lock.json"
INSTALL_HINT = "run `make agent-clis` (scripts/install_agent_clis.sh)"


def installed_clis_dir() -> Path | None:
    """Where scripts/install_agent_clis.sh puts the CLIs pinned by this checkout's lock file:
    `<engine cache>/agent-clis/<first 16 hex digits of the lock's sha256>`. None without the lock file."""
    if not CLIS_LOCK.is_file():
        return None
    digest = hashlib.sha256(CLIS_LOCK.read_bytes()).hexdigest()[:16]
    return cache_root() / "agent-clis" / digest


class EventParser(ABC):
    """Reads one agent's JSONL events into usage, a final message and violations."""

    def __init__(self, task: AgentTask, meter: CostMeter, toolbox: Toolbox, home: Path):
        self.task = task
        self.meter = meter
        self.toolbox = toolbox
        self.home = home
        self.final_text: str | None = None
        self.error: str | None = None
        self.claimed: bool | None = None
        self.events = 0
        self.last_type = ""

    def feed_line(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        self.events += 1
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            self.last_type = "non-json"
            return
        if isinstance(event, dict):
            self.last_type = str(event.get("type", ""))
            self.feed(event)

    @abstractmethod
    def feed(self, event: dict[str, Any]) -> None: ...

    def poll(self) -> None:  # noqa: B027 - optional: only an agent that reports usage off stdout needs it
        """Read what the agent writes besides its stdout (usage it reports nowhere else); called while it runs."""

    def finish(self) -> str | None:
        """After the agent ended: why it failed, if its events say so."""
        return self.error

    def check_command(self, command: str) -> None:
        try:
            self.toolbox.check_command(command)
        except ForbiddenCommand as error:
            raise AgentViolation(f"agent ran a forbidden command: {error}") from error

    def check_path(self, path: str) -> None:
        try:
            self.toolbox.resolve(path)
        except PathEscape as error:
            raise AgentViolation(f"agent wrote outside its worktree: {error}") from error


class CliAgent(ABC):
    """A coding agent run as a child process in its own session, its events streamed from a file."""

    name: str
    label: str

    def __init__(self, settings: AgentSettings):
        self.settings = settings

    @abstractmethod
    def configured_binary(self) -> str:
        """The binary setting: a path, or a name looked up among the installed CLIs, then on PATH."""

    @abstractmethod
    def args(self, task: AgentTask) -> list[str]:
        """The command line after the binary."""

    @abstractmethod
    def endpoint(self) -> str:
        """The model endpoint's base URL as the host reaches it (the provider's, unless configured)."""

    @abstractmethod
    def provider_env(self, base_url: str) -> dict[str, str]:
        """This agent's own endpoint (as the sandbox reaches it) and key, and nothing of any other provider's."""

    @abstractmethod
    def configure(self, task: AgentTask, home: Path, base_url: str) -> None:
        """Write the program's own configuration into its home (model, endpoint, approvals left to Daedalus)."""

    @abstractmethod
    def parser(self, task: AgentTask, meter: CostMeter, toolbox: Toolbox, home: Path) -> EventParser: ...

    def model(self, task: AgentTask) -> str | None:
        return task.agent.model

    def priced(self) -> bool:
        """Whether cost may be estimated from the price table (a paid endpoint, not a self-hosted model)."""
        return True

    def binary(self) -> Path:
        """The executable to run, or AgentConfigError saying how to install it."""
        configured = self.configured_binary()
        setting = f"DAEDALUS_AGENT_{self.name.upper()}_BIN"
        if "/" in configured:
            path = Path(configured)
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise AgentConfigError(
                    f"{self.name} executable {configured!r} ({setting}) does not exist or is not executable; "
                    f"{INSTALL_HINT}, or point {setting} at the program"
                )
            return path.absolute()
        installed = installed_clis_dir()
        if installed is not None and (installed / ".installed").exists():
            candidate = installed / "bin" / configured
            if candidate.exists():
                return candidate
        found = shutil.which(configured)
        if found is None:
            places = f"{installed / 'bin'} and PATH" if installed is not None else "PATH"
            raise AgentConfigError(
                f"{self.name} executable {configured!r} is not installed on this host (looked in {places}); "
                f"{INSTALL_HINT}, or set {setting} to its path"
            )
        return Path(found).absolute()

    def sandbox(
        self,
        task: AgentTask,
        home: Path,
        binary: Path,
        egress: Egress | None = None,
        base_url: str | None = None,
    ) -> Sandbox:
        """The agent's sandbox: its worktree, its own home under the artifacts (config, sessions, caches), its
        program (the whole installation it came from), and no network but its egress to the model."""
        passed = {name: os.environ[name] for name in self.settings.sandbox_pass_env if name in os.environ}
        program = binary.resolve()
        installed = installed_clis_dir()
        where = (
            [installed] if installed is not None and program.is_relative_to(installed) else [program.parent]
        )
        return Sandbox.for_worktree(
            Path(task.worktree),
            objects=objects_dir(Path(task.repo)),
            home=home,
            tmp_mib=task.limits.tmp_mib if task.limits is not None else None,
            read_only=[
                binary,
                *where,
                *(egress.read_only if egress else []),
                *self.settings.sandbox_read_only,
            ],
            writable=self.settings.sandbox_writable,
            env={
                **passed,
                **(egress.plan.env if egress else {}),
                **self.provider_env(base_url or self.endpoint()),
            },
        )

    async def run(
        self,
        task: AgentTask,
        *,
        artifacts: Path,
        heartbeat: Heartbeat,
        keep_on_cancel: Callable[[], bool] = lambda: False,
    ) -> AgentResult:
        binary = self.binary()
        self.provider_env(self.endpoint())  # no key: say so before anything is made
        home = artifacts / HOME_DIR
        home.mkdir(parents=True, exist_ok=True)
        egress = (
            Egress.create(plan_for(self.endpoint()), artifacts / EGRESS_LOG)
            if self.settings.sandbox_cli_network
            else None
        )
        token = step_token()
        started = time.time()
        confinement: Confinement | None = None
        try:
            base_url = egress.plan.base_url if egress is not None else self.endpoint()
            if egress is not None:
                (artifacts / EGRESS_FILE).write_text(
                    json.dumps(
                        {
                            "directory": str(egress.directory),
                            "endpoint": self.endpoint(),
                            "base_url": base_url,
                            "routes": [
                                str(r.upstream or ", ".join(map(str, r.allowed))) for r in egress.plan.routes
                            ],
                        }
                    )
                )
            self.configure(task, home, base_url)
            sandbox = self.sandbox(task, home, binary, egress, base_url)
            inner = [str(binary), *self.args(task)]
            command = sandbox.argv(egress.inner(inner) if egress else inner)
            if egress is not None:
                command = egress.outer(command)
            confinement = (  # the agent's program and every command it runs, under the host's step limits
                Confinement.start(task.limits, Path(task.cgroup_root) if task.cgroup_root else None)
                if task.limits is not None
                else None
            )
            if confinement is not None:
                confinement.record(artifacts / CONFINEMENT_FILE)
            with (artifacts / EVENTS_FILE).open("ab") as out, (artifacts / STDERR_FILE).open("ab") as err:
                process = await asyncio.create_subprocess_exec(
                    *command,
                    env=sandbox.environment(token),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    preexec_fn=confinement.preexec if confinement is not None else None,
                )
        except BaseException:
            if egress is not None:
                egress.remove()  # nothing was started: its gateway never will remove it
            if confinement is not None:
                confinement.end()
                (artifacts / CONFINEMENT_FILE).unlink(missing_ok=True)
            raise
        record = RunningRecord.of(process.pid, kind="process", agent=self.name, token=token)
        record.write(artifacts / RUNNING_FILE)
        log.info(
            "agent started", agent=self.name, pid=process.pid, ticket_id=task.ticket_id, attempt=task.attempt
        )
        assert process.stdin is not None
        try:
            # The prompt goes on stdin, which is then closed: the agent never waits on a terminal.
            process.stdin.write(build_prompt(task).encode())
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            process.stdin.close()
        return await self._supervise(
            task,
            record,
            artifacts=artifacts,
            heartbeat=heartbeat,
            started=started,
            alive=lambda: process.returncode is None,
            reap=process.wait,
            keep_on_cancel=keep_on_cancel,
        )

    async def attach(
        self,
        task: AgentTask,
        record: RunningRecord,
        *,
        artifacts: Path,
        heartbeat: Heartbeat,
        keep_on_cancel: Callable[[], bool] = lambda: False,
    ) -> AgentResult:
        """Follow an agent a previous activity attempt started; it may still run, or have finished unseen."""

        async def reap() -> int:
            while record.alive():
                await asyncio.sleep(POLL_S)
            return -1

        return await self._supervise(
            task,
            record,
            artifacts=artifacts,
            heartbeat=heartbeat,
            started=record.started_at,
            alive=record.alive,
            reap=reap,
            keep_on_cancel=keep_on_cancel,
            attached=True,
        )

    async def _supervise(
        self,
        task: AgentTask,
        record: RunningRecord,
        *,
        artifacts: Path,
        heartbeat: Heartbeat,
        started: float,
        alive: Callable[[], bool],
        reap: Callable[[], Any],
        keep_on_cancel: Callable[[], bool],
        attached: bool = False,
    ) -> AgentResult:
        meter = CostMeter(
            model=self.model(task),
            budget_usd=task.agent.budget_usd,
            path=artifacts / USAGE_FILE,
            priced=self.priced(),
        )
        # The parser's checks turn what the sandbox already contains into a clear FORBIDDEN result.
        toolbox = Toolbox(
            Path(task.worktree),
            deny=self.settings.deny_commands,
            sandbox=Sandbox.for_worktree(Path(task.worktree), objects=objects_dir(Path(task.repo))),
        )
        parser = self.parser(task, meter, toolbox, artifacts / HOME_DIR)
        beat = Throttle(heartbeat)
        stopped: ExitReason | None = None
        detail = ""
        events_path = artifacts / EVENTS_FILE
        wall_deadline = started + task.timeout_s
        with events_path.open("rb") as reader:
            buffer = b""
            last_event = time.monotonic()

            def drain(final: bool) -> None:
                nonlocal buffer, last_event
                chunk = reader.read()
                if chunk:
                    last_event = time.monotonic()
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        parser.feed_line(line)
                if final and buffer:
                    parser.feed_line(buffer)
                    buffer = b""
                parser.poll()

            try:
                while True:
                    exited = not alive()
                    drain(final=exited)
                    if exited:
                        break
                    now = time.monotonic()
                    if now - last_event > task.idle_timeout_s:
                        stopped, detail = (
                            ExitReason.TIMEOUT,
                            f"no event from {self.name} for {task.idle_timeout_s}s",
                        )
                        break
                    if time.time() > wall_deadline:
                        stopped, detail = (
                            ExitReason.TIMEOUT,
                            f"{self.name} ran past its {task.timeout_s}s limit",
                        )
                        break
                    beat({"pid": record.pid, "events": parser.events, "last": parser.last_type})
                    await asyncio.sleep(POLL_S)
            except BudgetExceeded as error:
                stopped, detail = ExitReason.BUDGET_EXCEEDED, str(error)
            except AgentViolation as error:
                stopped, detail = ExitReason.FORBIDDEN, str(error)
            except asyncio.CancelledError:
                if keep_on_cancel():
                    log.info("activity attempt ended; agent left running for the retry", pid=record.pid)
                    raise
                await asyncio.to_thread(self._end, record, artifacts)
                raise
            if stopped is not None:
                await asyncio.to_thread(kill_group, record.pid)
            returncode = await reap()
            # The agent is done: nothing it started may outlive it (its sandbox's pid namespace already
            # took them; the token catches anything that was not in it).
            hits = await asyncio.to_thread(self._end, record, artifacts)
            with contextlib.suppress(BudgetExceeded, AgentViolation):
                drain(final=True)  # what the agent wrote before it went: usage is kept even when aborted
        (artifacts / RUNNING_FILE).unlink(missing_ok=True)
        if stopped is None:
            stopped, detail = self.outcome(parser, returncode, artifacts, attached=attached)
        if hits:
            detail = "; ".join([detail, *(f"{self.name} {hit}" for hit in hits)]).lstrip("; ")
        claimed = parser.claimed if parser.claimed is not None else claimed_success(parser.final_text)
        return make_result(
            task,
            label=self.label,
            reason=stopped,
            meter=meter,
            transcript=events_path,
            detail=detail,
            claimed=claimed,
            traps=reported_traps(parser.final_text),
            started=started,
        )

    @staticmethod
    def _end(record: RunningRecord, artifacts: Path) -> list[str]:
        """End the agent's whole tree; the limits it ran into (its cgroup, then removed)."""
        if record.token:
            end_step(record.pid, record.token)
        else:
            kill_group(record.pid)
        hits: list[str] = []
        confinement = Confinement.recorded(artifacts / CONFINEMENT_FILE)
        if confinement is not None:
            hits, _ = confinement.end()
            (artifacts / CONFINEMENT_FILE).unlink(missing_ok=True)
        # The gateway removes its sockets when it ends; one killed outright leaves them behind.
        with contextlib.suppress(OSError, ValueError, KeyError):
            directory = Path(json.loads((artifacts / EGRESS_FILE).read_text())["directory"])
            if directory.name.startswith("daedalus-egress-"):
                shutil.rmtree(directory, ignore_errors=True)
        return hits

    def outcome(
        self, parser: EventParser, returncode: int, artifacts: Path, *, attached: bool
    ) -> tuple[ExitReason, str]:
        error = parser.finish()
        if error:
            return ExitReason.FAILED, f"{self.name} reported an error: {error}"
        if returncode not in (0, -1):
            tail = (artifacts / STDERR_FILE).read_bytes()[-600:].decode(errors="replace").strip()
            return ExitReason.FAILED, f"{self.name} exited {returncode}: {tail or 'no stderr'}"
        if parser.events == 0:
            return ExitReason.FAILED, f"{self.name} produced no events"
        note = " (followed after a worker retry)" if attached else ""
        # COMMITTED here only means "finished"; verification against the branch decides.
        return ExitReason.COMMITTED, f"{self.name} finished{note}"
