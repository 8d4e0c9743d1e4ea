"""The local model for a `codex` or `claude` ticket when no provider key is set (`daedalus demo --agent codex`).

The ticket's `agent.patch` says what the change is; the local model server (daedalus.agents.model_server) then
answers the real CLI with tool calls that read and write each changed file's new contents, a command that shows
the diff, and a final message. The CLI, its sandbox, its egress and Daedalus's parsing of its output are the ones a
real provider would drive; only the model is scripted, and it says so in its final message.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import SecretStr

from daedalus.agents.model_server import Action, ModelScript, ModelServer, ReadFile, Reply, Shell, WriteFile
from daedalus.agents.settings import AgentSettings
from daedalus.errors import AgentConfigError
from daedalus.schemas.ticket import AgentName, TicketSpec

LOCAL_KEY = "daedalus-local-model"


def needs_local_model(spec: TicketSpec, settings: AgentSettings) -> bool:
    """A CLI agent whose provider has no key on this machine."""
    if spec.agent is None:
        return False
    if spec.agent.name is AgentName.CODEX:
        return settings.openai_api_key is None
    if spec.agent.name is AgentName.CLAUDE:
        return settings.anthropic_api_key is None
    return False


def files_after(repo: Path, base_commit: str, patch: str) -> dict[str, tuple[bool, str]]:
    """The files `patch` changes: whether each was there before, and its contents once `patch` is applied to
    `base_commit` of `repo`."""
    with tempfile.TemporaryDirectory(prefix="daedalus-local-model-") as scratch:
        checkout = Path(scratch)

        def git(*args: str, stdin: str | None = None) -> str:
            done = subprocess.run(
                ["git", *args], cwd=checkout, input=stdin, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise AgentConfigError(
                    f"the ticket's agent.patch does not apply to {base_commit} of {repo}, so the local model "
                    f"cannot make its change: {done.stderr.strip()}"
                )
            return done.stdout

        git("init", "--quiet")
        git("fetch", "--quiet", "--depth=1", str(repo.resolve()), base_commit)
        git("checkout", "--quiet", "FETCH_HEAD")
        changed = git("apply", "--numstat", "-", stdin=patch)
        names = [line.split("\t", 2)[2] for line in changed.splitlines() if line.count("\t") >= 2]
        existed = {name: (checkout / name).is_file() for name in names}
        git("apply", "-", stdin=patch)
        return {
            name: (existed[name], (checkout / name).read_text())
            for name in names
            if (checkout / name).is_file()
        }


def script_for(spec: TicketSpec) -> ModelScript:
    """The local model's answers for this ticket: write what its patch changes, show the diff, report."""
    if spec.agent is None or not spec.agent.patch or spec.engine is None:
        raise AgentConfigError(
            f"ticket {spec.id} has no agent.patch to say what its change is; without an API key the local model "
            "can only make a change the spec spells out (set DAEDALUS_AGENT_OPENAI_API_KEY or "
            "DAEDALUS_AGENT_ANTHROPIC_API_KEY to use a real model)"
        )
    files = files_after(Path(spec.engine.repo), spec.engine.base_commit, spec.agent.patch)
    steps: list[Action] = []
    for path, (existed, content) in files.items():
        # Claude Code overwrites a file only after reading it; for Codex the read is a `cat`.
        steps += [ReadFile(path), WriteFile(path, content)] if existed else [WriteFile(path, content)]
    summary = ", ".join(files) or "nothing"
    reply = f"Changed {summary} as the ticket's patch says (the local scripted model, not a real one).\n"
    return ModelScript.of(*steps, Shell("git diff --stat"), Reply(reply + "RESULT: success"))


@contextmanager
def local_model(spec: TicketSpec, settings: AgentSettings) -> Iterator[AgentSettings]:
    """The agent settings to run `spec` with: unchanged when its provider has a key; else pointing its CLI at a
    local model server, running for the duration, that answers with `script_for(spec)`."""
    if not needs_local_model(spec, settings):
        yield settings
        return
    with ModelServer({LOCAL_KEY: script_for(spec)}) as server:
        key = SecretStr(LOCAL_KEY)
        yield settings.model_copy(
            update={
                "openai_base_url": f"{server.url}/v1",
                "openai_api_key": key,
                "openai_priced": False,
                "anthropic_base_url": server.url,
                "anthropic_api_key": key,
            }
        )
