"""Engine repos by URL: a host mirror cloned and fetched over file:// and git:// (a real `git daemon` on
127.0.0.1), attempts' worktrees made from it, and an unreachable repo or a missing commit reported as an
environment error through a real Temporal activity: no agent runs, nothing is retried."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from daedalus.activities.attempts import AttemptActivities
from daedalus.activities.workspace import Workspace
from daedalus.agents.base import RESULT_FILE, RUNNING_FILE
from daedalus.agents.settings import AgentSettings
from daedalus.hosts.mirrors import ENVIRONMENT_ERROR, EngineRepoUnavailable, is_url, mirror_path
from daedalus.ports import free_port
from daedalus.schemas.agents import AgentResult, ExitReason
from daedalus.schemas.steps import AttemptInput
from daedalus.schemas.ticket import EngineRef, RepoKind
from tests.support import make_engine_repo, ticket_spec


def commit(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", name], cwd=repo, check=True
    )
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


def engine(url: str, base: str = "main") -> EngineRef:
    return EngineRef(name="1cat-vllm", kind=RepoKind.VLLM, repo=url, base_commit=base)


@pytest.fixture
def git_daemon(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """`git daemon` serving a bare copy of an engine repo on 127.0.0.1."""
    served = tmp_path / "served"
    served.mkdir()
    source = make_engine_repo(tmp_path / "upstream")
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(served / "1cat-vllm.git")], check=True)
    port = free_port()
    daemon = subprocess.Popen(
        ["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack", f"--base-path={served}",
         "--listen=127.0.0.1", f"--port={port}", str(served)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"git://127.0.0.1:{port}/1cat-vllm.git"
    for _ in range(100):
        if subprocess.run(["git", "ls-remote", url], capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    yield url, source, daemon
    daemon.terminate()
    daemon.wait(10)


def test_urls_are_told_from_local_paths() -> None:
    for url in ("git@desktop:inference/1cat-vllm.git", "ssh://git@desktop/x.git", "file:///srv/x.git",
                "git://127.0.0.1:9418/x.git", "https://github.com/vllm-project/vllm"):  # fmt: skip
        assert is_url(url), url
    for path in (".daedalus/demo/serving-config", "/srv/engines/llama.cpp", "~/src/vllm"):
        assert not is_url(path), path
    assert mirror_path(Path("/m"), "git@desktop:inference/1cat-vllm.git").name.startswith("1cat-vllm-")
    assert mirror_path(Path("/m"), "a/x.git") != mirror_path(Path("/m"), "b/x.git")


def test_a_mirror_is_cloned_once_fetched_before_each_attempt_and_worktrees_come_from_it(
    tmp_path: Path, git_daemon: tuple[str, Path, subprocess.Popen[bytes]]
) -> None:
    url, upstream, _ = git_daemon
    workspace = Workspace(root=tmp_path / "host", artifacts=tmp_path / "artifacts")
    mirror = workspace.sync_engine(engine(url), "mavis")
    assert mirror == workspace.repo_path(engine(url)) and (mirror / "HEAD").exists()
    assert subprocess.run(["git", "rev-parse", "--is-bare-repository"], cwd=mirror, capture_output=True,
                          text=True).stdout.strip() == "true"  # fmt: skip
    # A commit pushed upstream after the first clone is there at the next attempt's fetch.
    new = commit(upstream, "fix.txt", "chunked workspace\n")
    subprocess.run(["git", "push", "-q", url, "main"], cwd=upstream, check=True)
    with pytest.raises(EngineRepoUnavailable):
        workspace.sync_engine(engine(url, base=new[:12] + "0" * 28), "mavis")
    assert workspace.sync_engine(engine(url, base=new), "mavis") == mirror


def test_file_urls_and_missing_commits(tmp_path: Path) -> None:
    upstream = make_engine_repo(tmp_path / "upstream")
    workspace = Workspace(root=tmp_path / "host", artifacts=tmp_path / "artifacts")
    url = f"file://{upstream}"
    workspace.sync_engine(engine(url), "mavis")
    with pytest.raises(EngineRepoUnavailable, match=r"commit 'f7332846' does not exist in engine repo file://.*"
                       r"Fix: push the commit to that repo, or correct the ticket's engine.base_commit"):  # fmt: skip
        workspace.sync_engine(engine(url, base="f7332846"), "mavis")
    with pytest.raises(
        EngineRepoUnavailable, match=r"cannot be reached from host mavis: .*Fix: check the URL"
    ):
        workspace.sync_engine(engine(f"file://{tmp_path / 'nowhere.git'}"), "mavis")
    assert not list((tmp_path / "host" / "mirrors").glob("nowhere*.git*"))  # no half-made mirror left behind


@workflow.defn(sandboxed=False)
class AttemptOnce:
    @workflow.run
    async def run(self, request: AttemptInput) -> AgentResult:
        return await workflow.execute_activity(
            "run_attempt",
            request,
            result_type=AgentResult,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=0.1)),
        )


async def _attempt(client: Client, queue: str, workspace: Workspace, request: AttemptInput) -> AgentResult:
    async with Worker(
        client,
        task_queue=queue,
        workflows=[AttemptOnce],
        activities=[AttemptActivities(workspace, AgentSettings()).run_attempt],
    ):
        return await client.execute_workflow(
            AttemptOnce.run, request, id=f"attempt-{uuid.uuid4()}", task_queue=queue
        )


async def test_an_attempt_works_in_a_worktree_of_the_hosts_mirror(
    tmp_path: Path,
    git_daemon: tuple[str, Path, subprocess.Popen[bytes]],
    temporal_client: Client,
    task_queue: str,
) -> None:
    url, _, _ = git_daemon
    workspace = Workspace(root=tmp_path / "host", artifacts=tmp_path / "artifacts")
    spec = ticket_spec(
        tmp_path, "mavis", engine={"name": "1cat-vllm", "kind": "vllm", "repo": url, "base_commit": "main"}
    )
    result = await _attempt(
        temporal_client, task_queue, workspace, AttemptInput(spec=spec, attempt=1, brief="b")
    )
    assert result.exit_reason is ExitReason.COMMITTED, result.detail
    worktree = workspace.worktree(spec.id, 1)
    assert (worktree / "speed.txt").read_text() == "56.0\n"
    mirror = workspace.repo_path(spec.engine)  # type: ignore[arg-type]
    # the worktree is a private checkout borrowing the mirror's objects; the host committed onto the mirror
    alternates = (worktree / ".git" / "objects" / "info" / "alternates").read_text().strip()
    assert alternates == str((mirror / "objects").resolve())
    branch = subprocess.run(["git", f"--git-dir={mirror}", "rev-parse", f"refs/heads/daedalus/{spec.id}/attempt-1"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert branch == result.commit


async def test_an_unreachable_repo_is_an_environment_error_and_no_agent_runs(
    tmp_path: Path,
    git_daemon: tuple[str, Path, subprocess.Popen[bytes]],
    temporal_client: Client,
    task_queue: str,
) -> None:
    url, _, daemon = git_daemon
    daemon.terminate()
    daemon.wait(10)
    workspace = Workspace(root=tmp_path / "host", artifacts=tmp_path / "artifacts")
    spec = ticket_spec(
        tmp_path, "mavis", engine={"name": "1cat-vllm", "kind": "vllm", "repo": url, "base_commit": "main"}
    )
    started = time.monotonic()
    with pytest.raises(WorkflowFailureError) as failed:
        await _attempt(temporal_client, task_queue, workspace, AttemptInput(spec=spec, attempt=1, brief="b"))
    assert time.monotonic() - started < 20
    cause = failed.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
    error = cause.cause
    assert error.type == ENVIRONMENT_ERROR and error.non_retryable
    assert f"engine repo {url} cannot be reached from host mavis" in error.message
    artifacts = workspace.attempt_artifacts(spec.id, 1)
    assert not (artifacts / RUNNING_FILE).exists() and not (artifacts / RESULT_FILE).exists()
