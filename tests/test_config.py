"""The one Settings object: sections from DAEDALUS_* variables and .env, older names, and errors naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daedalus.agents.settings import AgentSettings
from daedalus.config import LEGACY_NAMES, Settings
from daedalus.devserver import DevServer
from daedalus.errors import BadSettings
from daedalus.slack.settings import SlackSettings
from daedalus.worker import WorkerConfig


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No DAEDALUS_* variable or provider key from the developer's shell, and no .env but the test's own."""
    for name in list(os.environ):
        if name.startswith("DAEDALUS_") or name in LEGACY_NAMES:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def test_defaults_need_no_environment(tmp_path: Path) -> None:
    settings = Settings.load()
    assert settings.home == tmp_path / ".daedalus" and settings.home.is_absolute()
    assert settings.store_url == f"sqlite:///{tmp_path / '.daedalus' / 'daedalus.db'}"
    assert settings.artifact_dir == tmp_path / ".daedalus" / "artifacts"
    assert (
        settings.temporal.target == "127.0.0.1:7233" and settings.temporal.control_queue == "daedalus-control"
    )
    assert settings.slack.bot_token is None and not settings.slack.posting and settings.api.url is None
    assert settings.agent.codex_bin == "codex" and settings.engines.cache_dir.name == ".cache"


def test_the_documented_variables_fill_their_sections(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    documented = {
        "DAEDALUS_HOME": str(tmp_path / "state"),
        "DAEDALUS_DATABASE_URL": "postgresql+psycopg://daedalus@db:5432/daedalus",
        "DAEDALUS_TEMPORAL_ADDRESS": "temporal:7233",
        "DAEDALUS_SLACK_BOT_TOKEN": "xoxb-1",
        "DAEDALUS_SLACK_CHANNEL": "C0DECISIONS",
        "DAEDALUS_SLACK_USERS": '{"U123": "Wayne"}',
        "DAEDALUS_API_URL": "https://daedalus.example:8000/",
        "DAEDALUS_API_TOKEN": "dtk_s3cret",
        "DAEDALUS_TEMPORAL_TLS_CLIENT_CERT": "/etc/daedalus/client.pem",
        "DAEDALUS_TEMPORAL_TLS_CLIENT_KEY": "/etc/daedalus/client.key",
        "DAEDALUS_TEMPORAL_API_KEY": "temporal-key",
        "DAEDALUS_API_UPDATE_TIMEOUT_S": "7.5",
        "DAEDALUS_AGENT_CODEX_BIN": "/opt/codex",
        "DAEDALUS_AGENT_CODEX_ARGS": '["--sandbox", "read-only"]',
        "DAEDALUS_CACHE_DIR": str(tmp_path / "cache"),
        "DAEDALUS_CONTROL_QUEUE": "q-old-name",
        "DAEDALUS_UI_PORT": "9233",
        "OPENAI_API_KEY": "sk-openai",
    }
    for name, value in documented.items():
        monkeypatch.setenv(name, value)
    s = Settings.load()
    assert s.home == tmp_path / "state" and s.store_url == documented["DAEDALUS_DATABASE_URL"]
    assert s.temporal.target == "temporal:7233" and s.temporal.control_queue == "q-old-name"
    assert s.temporal.ui_port == 9233
    assert s.slack.bot_token is not None and s.slack.bot_token.get_secret_value() == "xoxb-1"
    assert s.slack.posting and s.slack.users == {"U123": "wayne"}
    assert s.api.url == "https://daedalus.example:8000" and s.api.update_timeout_s == 7.5
    assert s.api.token is not None and s.api.token.get_secret_value() == "dtk_s3cret"
    assert s.temporal.tls_client_cert == Path("/etc/daedalus/client.pem")
    assert s.temporal.api_key is not None and s.temporal.api_key.get_secret_value() == "temporal-key"
    assert s.agent.codex_bin == "/opt/codex" and s.agent.codex_args == ["--sandbox", "read-only"]
    assert s.agent.openai_api_key is not None and s.agent.openai_api_key.get_secret_value() == "sk-openai"
    assert s.engines.cache_dir == tmp_path / "cache"
    assert s.engines.llama_source.is_relative_to(tmp_path / "cache" / "src")

    # The sectioned name wins over the older one, and over the provider's own key name.
    monkeypatch.setenv("DAEDALUS_TEMPORAL_CONTROL_QUEUE", "q-new-name")
    monkeypatch.setenv("DAEDALUS_AGENT_OPENAI_API_KEY", "sk-daedalus")
    monkeypatch.setenv("DAEDALUS_ENGINES_CACHE_DIR", str(tmp_path / "cache2"))
    s = Settings.load()
    assert s.temporal.control_queue == "q-new-name" and s.engines.cache_dir == tmp_path / "cache2"
    assert s.agent.openai_api_key is not None and s.agent.openai_api_key.get_secret_value() == "sk-daedalus"


def test_a_dot_env_file_is_read_and_the_environment_overrides_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".env").write_text(
        "DAEDALUS_SLACK_BOT_TOKEN=xoxb-from-file\n"
        "DAEDALUS_SLACK_CHANNEL=C0FILE\n"
        "DAEDALUS_API_URL=http://api.example\n"
        "DAEDALUS_CACHE_DIR=/srv/cache\n"
        "ANTHROPIC_API_KEY=sk-ant-file\n"
    )
    s = Settings.load()
    assert s.slack.bot_token is not None and s.slack.bot_token.get_secret_value() == "xoxb-from-file"
    assert s.slack.channel == "C0FILE" and s.api.url == "http://api.example"
    assert s.engines.cache_dir == Path("/srv/cache")
    assert (
        s.agent.anthropic_api_key is not None
        and s.agent.anthropic_api_key.get_secret_value() == "sk-ant-file"
    )

    monkeypatch.setenv("DAEDALUS_SLACK_CHANNEL", "C0ENV")
    monkeypatch.setenv("DAEDALUS_CACHE_DIR", "/env/cache")
    s = Settings.load()
    assert s.slack.channel == "C0ENV" and s.engines.cache_dir == Path("/env/cache")
    assert s.slack.bot_token is not None and s.slack.bot_token.get_secret_value() == "xoxb-from-file"

    # Another file by name, or none at all.
    other = tmp_path / "prod.env"
    other.write_text("DAEDALUS_SLACK_BOT_TOKEN=xoxb-prod\n")
    assert Settings.load(env_file=other).slack.bot_token.get_secret_value() == "xoxb-prod"  # type: ignore[union-attr]
    assert Settings.load(env_file=None).slack.bot_token is None


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("DAEDALUS_TEMPORAL_UI_PORT", "nine", "DAEDALUS_TEMPORAL_UI_PORT (or DAEDALUS_UI_PORT): Input should be a valid integer"),
        ("DAEDALUS_UI_PORT", "70000", "DAEDALUS_TEMPORAL_UI_PORT (or DAEDALUS_UI_PORT): Input should be less than or equal to 65535"),
        ("DAEDALUS_SLACK_USERS", '{"U1": "no way"}', "DAEDALUS_SLACK_USERS: DAEDALUS_SLACK_USERS maps to names that are not Daedalus people: ['no way']"),
        ("DAEDALUS_API_TOKENS", '{"s3cret": "wayne"}', "DAEDALUS_API_TOKENS (a plaintext token map) is no longer read: API tokens are now stored hashed in the store. To convert: for each person in the old map run `daedalus token create --person <person>`"),
        ("DAEDALUS_API_URL", "daedalus:8000", "DAEDALUS_API_URL: must start with http:// or https://"),
        ("DAEDALUS_TEMPORAL_TLS_CLIENT_CERT", "/x.pem", "mTLS needs both DAEDALUS_TEMPORAL_TLS_CLIENT_CERT and DAEDALUS_TEMPORAL_TLS_CLIENT_KEY"),
        ("DAEDALUS_AGENT_LEAD_PROVIDER", "gemini", "DAEDALUS_AGENT_LEAD_PROVIDER: String should match pattern"),
        ("DAEDALUS_SLACK_CHANEL", "C0TYPO", "DAEDALUS_SLACK_CHANEL: Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_a_bad_value_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(BadSettings) as bad:
        Settings.load()
    assert expected in str(bad.value), str(bad.value)
    assert "fix the environment or .env" in str(bad.value)


def test_a_bad_value_in_dot_env_names_its_variable(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("DAEDALUS_SLACK_USERS=U1:wayne\n")
    with pytest.raises(BadSettings, match=r"DAEDALUS_SLACK_USERS: not JSON .*got 'U1:wayne'"):
        Settings.load()


def test_sections_never_read_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only Settings.load() at an entry point reads DAEDALUS_*: a section built below it holds what it is given."""
    monkeypatch.setenv("DAEDALUS_SLACK_BOT_TOKEN", "xoxb-leaked")
    monkeypatch.setenv("DAEDALUS_AGENT_CODEX_BIN", "/leaked/codex")
    (tmp_path / ".env").write_text("DAEDALUS_SLACK_CHANNEL=C0LEAKED\n")
    assert SlackSettings().bot_token is None and SlackSettings().channel is None
    assert AgentSettings().codex_bin == "codex"
    config = WorkerConfig(control_queue="q", hosts=["h"], workspace_root=tmp_path, artifacts=tmp_path)
    assert not config.slack.posting and config.agent.codex_bin == "codex"
    built = WorkerConfig.from_settings(Settings.load(), hosts=["h"])
    assert built.slack.posting and built.agent.codex_bin == "/leaked/codex"
    assert built.artifacts == tmp_path / ".daedalus" / "artifacts"


def test_the_cli_stops_at_a_bad_value_with_its_name(tmp_path: Path) -> None:
    env = {**os.environ, "DAEDALUS_TEMPORAL_PORT": "seventy"}
    daedalus = Path(sys.executable).parent / "daedalus"
    done = subprocess.run(
        [str(daedalus), "ticket", "list"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "DAEDALUS_TEMPORAL_PORT: Input should be a valid integer" in done.stderr
    assert "'seventy'" in done.stderr and "Traceback" not in done.stderr


def test_the_embedded_servers_sqlite_sync_is_a_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """synchronous=normal (the default) survives a process crash; full also survives a power loss."""
    assert Settings.load().temporal.sqlite_synchronous == "normal"
    monkeypatch.setenv("DAEDALUS_TEMPORAL_SQLITE_SYNCHRONOUS", "full")
    chosen = Settings.load().temporal.sqlite_synchronous
    command = DevServer(db_file=tmp_path / "t.db", port=1, ui_port=None, synchronous=chosen).command()
    assert "synchronous=full" in command and "journal_mode=wal" in command


def test_the_control_workers_workflow_cache_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """More parked tickets than the cache pay a replay per decision; the cache size is the operator's choice."""
    assert WorkerConfig.from_settings(Settings.load(), hosts=[]).max_cached_workflows == 1000
    monkeypatch.setenv("DAEDALUS_TEMPORAL_WORKFLOW_CACHE", "6000")
    assert WorkerConfig.from_settings(Settings.load(), hosts=[]).max_cached_workflows == 6000
    monkeypatch.setenv("DAEDALUS_TEMPORAL_WORKFLOW_CACHE", "0")
    with pytest.raises(BadSettings, match=r"DAEDALUS_TEMPORAL_WORKFLOW_CACHE: Input should be greater than"):
        Settings.load()


def test_temporals_workflow_sandbox_is_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerConfig.from_settings(Settings.load(), hosts=[]).sandboxed
    monkeypatch.setenv("DAEDALUS_TEMPORAL_SANDBOX", "false")
    assert not WorkerConfig.from_settings(Settings.load(), hosts=[]).sandboxed
    monkeypatch.setenv("DAEDALUS_TEMPORAL_SANDBOX", "sometimes")
    with pytest.raises(BadSettings, match=r"DAEDALUS_TEMPORAL_SANDBOX: Input should be a valid boolean"):
        Settings.load()
