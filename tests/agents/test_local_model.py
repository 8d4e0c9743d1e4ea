"""The local model a `codex` or `claude` ticket gets when no key is set (`daedalus demo --agent codex`): the
ticket's patch becomes the real CLI's tool calls, and the CLI makes exactly that change."""

from __future__ import annotations

from pathlib import Path

import pytest

from daedalus.agents.claude import ClaudeAgent
from daedalus.agents.codex import CodexAgent
from daedalus.agents.local_model import local_model, needs_local_model, script_for
from daedalus.agents.model_server import ReadFile, Reply, Shell, WriteFile
from daedalus.agents.settings import AgentSettings
from daedalus.errors import AgentConfigError
from daedalus.schemas.agents import ExitReason
from tests.agents.clis import installed
from tests.agents.conftest import Beats, MakeTask
from tests.support import SPEED_PATCH, make_engine_repo, ticket_spec


def test_the_patch_becomes_writes_of_each_changed_file(tmp_path: Path) -> None:
    repo = make_engine_repo(tmp_path / "repo")
    spec = ticket_spec(repo, "h", agent={"name": "codex", "patch": SPEED_PATCH})
    steps = [step.action for step in script_for(spec).steps]
    assert steps[:3] == [ReadFile("speed.txt"), WriteFile("speed.txt", "56.0\n"), Shell("git diff --stat")]
    assert isinstance(steps[3], Reply) and steps[3].text.endswith("RESULT: success")
    assert "not a real one" in steps[3].text
    new_file = "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+56.0\n"
    spec = ticket_spec(repo, "h", agent={"name": "codex", "patch": new_file})
    first = script_for(spec).steps[0].action
    assert first == WriteFile("new.txt", "56.0\n"), "a new file is written without a read"


def test_a_patch_that_does_not_apply_or_no_patch_says_what_to_do(tmp_path: Path) -> None:
    repo = make_engine_repo(tmp_path / "repo")
    bad = SPEED_PATCH.replace("-28.9", "-99.9")
    with pytest.raises(AgentConfigError, match="does not apply to main"):
        script_for(ticket_spec(repo, "h", agent={"name": "codex", "patch": bad}))
    with pytest.raises(AgentConfigError, match="DAEDALUS_AGENT_OPENAI_API_KEY"):
        script_for(ticket_spec(repo, "h", agent={"name": "claude"}))


def test_only_a_cli_agent_without_its_key_gets_the_local_model(tmp_path: Path) -> None:
    repo = make_engine_repo(tmp_path / "repo")
    codex = ticket_spec(repo, "h", agent={"name": "codex", "patch": SPEED_PATCH})
    scripted = ticket_spec(repo, "h")
    assert needs_local_model(codex, AgentSettings())
    assert not needs_local_model(codex, AgentSettings(openai_api_key="sk-real"))  # type: ignore[arg-type]
    assert not needs_local_model(scripted, AgentSettings())
    keyed = AgentSettings(openai_api_key="sk-real")  # type: ignore[arg-type]
    with local_model(codex, keyed) as settings:
        assert settings is keyed, "with a key, the provider is used through the same code path"


@pytest.mark.parametrize("name", ["codex", "claude"])
async def test_the_real_cli_makes_the_tickets_change_against_the_local_model(
    name: str, make_task: MakeTask, artifacts: Path, beats: Beats
) -> None:
    installed()
    task = make_task({"name": name, "patch": SPEED_PATCH})
    spec = ticket_spec(Path(task.repo), "h", agent={"name": name, "patch": SPEED_PATCH})
    with local_model(spec, AgentSettings()) as settings:
        assert settings.openai_base_url is not None and settings.openai_base_url.startswith(
            "http://127.0.0.1:"
        )
        agent = CodexAgent(settings) if name == "codex" else ClaudeAgent(settings)
        result = await agent.run(task, artifacts=artifacts, heartbeat=beats)
    assert result.exit_reason is ExitReason.COMMITTED and result.claimed_success, result.detail
    assert (Path(task.worktree) / "speed.txt").read_text() == "56.0\n"
    assert result.usage.input_tokens > 0 and result.usage.cost_source == "unavailable"
