"""Daedalus's one settings object, from DAEDALUS_* environment variables and a `.env` file.

Built once at each entry point (the CLI, `daedalus api serve`, the workers of `up`/`worker`/`demo`) with
`Settings.load()`, then passed down: nothing below the entry points reads the environment, and workflows never
import this module. Each section is a plain pydantic model owned by its domain and read from
`DAEDALUS_<SECTION>_<FIELD>`:

    home, host, artifacts   DAEDALUS_HOME, DAEDALUS_HOST, DAEDALUS_ARTIFACTS
    hosts_file, policy_file DAEDALUS_HOSTS_FILE, DAEDALUS_POLICY_FILE
    database                DAEDALUS_DATABASE_URL
    temporal                DAEDALUS_TEMPORAL_ADDRESS, _PORT, _UI_PORT, _NAMESPACE, _CONTROL_QUEUE,
                            _WORKFLOW_CACHE, _SQLITE_SYNCHRONOUS,
                            _TLS, _TLS_SERVER_CA, _TLS_CLIENT_CERT, _TLS_CLIENT_KEY, _TLS_SERVER_NAME, _API_KEY
    agent                   DAEDALUS_AGENT_* (daedalus.agents.settings)
    api                     DAEDALUS_API_UPDATE_TIMEOUT_S; for the CLI DAEDALUS_API_URL, _TOKEN (daedalus.api.settings)
    slack                   DAEDALUS_SLACK_* (daedalus.slack.settings)
    engines                 DAEDALUS_ENGINES_CACHE_DIR, DAEDALUS_ENGINES_LLAMA_CPP_PYTHON_VERSION
    steps                   DAEDALUS_STEPS_READ_ONLY, _LIMITS, _CGROUP_ROOT (daedalus.confinement)
    audit                   DAEDALUS_AUDIT_KEY, DAEDALUS_AUDIT_KEY_FILE (daedalus.store.seals)

Lists and maps are JSON (`DAEDALUS_SLACK_USERS='{"U123": "wayne"}'`). The names used before the settings had
sections still work (`LEGACY_NAMES`); where both are set, the sectioned name wins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from daedalus.agents.settings import AgentSettings
from daedalus.api.settings import ApiSettings
from daedalus.confinement import StepSettings
from daedalus.devserver import SqliteSynchronous
from daedalus.engines.paths import EngineSettings
from daedalus.errors import BadSettings
from daedalus.ids import CONTROL_QUEUE
from daedalus.paths import REPO_ROOT
from daedalus.slack.settings import SlackSettings
from daedalus.store.seals import AuditKey, AuditSettings

__all__ = [
    "CONTROL_QUEUE",
    "LEGACY_NAMES",
    "DatabaseSettings",
    "EngineSettings",
    "Settings",
    "TemporalSettings",
]

PREFIX = "DAEDALUS_"

LEGACY_NAMES: dict[str, tuple[str, str]] = {
    "DAEDALUS_UI_PORT": ("temporal", "ui_port"),
    "DAEDALUS_NAMESPACE": ("temporal", "namespace"),
    "DAEDALUS_CONTROL_QUEUE": ("temporal", "control_queue"),
    "DAEDALUS_CACHE_DIR": ("engines", "cache_dir"),
    "LLAMA_CPP_PYTHON_VERSION": ("engines", "llama_cpp_python_version"),
    "OPENAI_API_KEY": ("agent", "openai_api_key"),
    "ANTHROPIC_API_KEY": ("agent", "anthropic_api_key"),
}
"""Names from before the sections (and the providers' own key names) -> (section, field)."""


class DatabaseSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(
        default=None,
        description="the audit store, e.g. postgresql+psycopg://host/db; None = SQLite under home",
    )


class TemporalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        default=None, description="an existing cluster; None = the embedded dev server"
    )
    port: int = Field(default=7233, ge=1, le=65535, description="the embedded dev server's port")
    ui_port: int = Field(default=8233, ge=1, le=65535, description="the embedded dev server's Web UI")
    namespace: str = "default"
    control_queue: str = Field(default=CONTROL_QUEUE, min_length=1)
    workflow_cache: int = Field(
        default=1000,
        ge=1,
        description="workflows the control worker keeps in memory (about 0.2 MB each); one that is not is "
        "replayed from its history when it next has work",
    )
    sandbox: bool = Field(
        default=True,
        description="run workflow code in Temporal's sandbox, which refuses non-deterministic calls as they "
        "happen; off, the control worker runs a workflow task in about a third less time and keeps half the "
        "memory per cached workflow, and only replay tests catch such a call",
    )
    sqlite_synchronous: SqliteSynchronous = Field(
        default="normal",
        description="the embedded server's SQLite sync: normal survives a process crash, full also a power loss",
    )

    @property
    def target(self) -> str:
        """Where clients and workers connect."""
        return self.address or f"127.0.0.1:{self.port}"

    # --- Identity: only Daedalus's services reach a production frontend (README, "Closing Temporal") ---
    tls: bool = Field(default=False, description="connect with TLS (implied by every tls_* file and api_key)")
    tls_server_ca: Path | None = Field(
        default=None,
        description="PEM root CA the frontend's certificate is checked against; None = system CAs",
    )
    tls_client_cert: Path | None = Field(default=None, description="PEM client certificate for mTLS")
    tls_client_key: Path | None = Field(default=None, description="PEM private key of tls_client_cert")
    tls_server_name: str | None = Field(
        default=None, description="the name the frontend's certificate carries, when not the address's host"
    )
    api_key: SecretStr | None = Field(
        default=None, description="a Temporal Cloud API key, sent with every call (TLS is implied)"
    )

    @field_validator(
        "tls_server_ca", "tls_client_cert", "tls_client_key", "tls_server_name", "api_key", mode="before"
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value  # docker-compose passes `${VAR:-}` through as ""

    @model_validator(mode="after")
    def _client_cert_with_key(self) -> TemporalSettings:
        if (self.tls_client_cert is None) != (self.tls_client_key is None):
            raise ValueError(
                "mTLS needs both DAEDALUS_TEMPORAL_TLS_CLIENT_CERT and DAEDALUS_TEMPORAL_TLS_CLIENT_KEY "
                "(a certificate and its private key, PEM)"
            )
        return self

    def connection(self) -> dict[str, Any]:
        """`Client.connect` keyword arguments for TLS, mTLS and an API key; the PEM files are read here."""
        api_key = self.api_key.get_secret_value() if self.api_key else None
        pem = (self.tls_server_ca, self.tls_client_cert, self.tls_client_key)
        if not any(pem) and self.tls_server_name is None:
            return {"tls": self.tls or api_key is not None, "api_key": api_key}
        from temporalio.service import TLSConfig  # here: most starts name no TLS file

        ca, cert, key = (
            _read_pem(path, f"DAEDALUS_TEMPORAL_{name}")
            for path, name in zip(pem, ("TLS_SERVER_CA", "TLS_CLIENT_CERT", "TLS_CLIENT_KEY"), strict=True)
        )
        tls = TLSConfig(
            server_root_ca_cert=ca, domain=self.tls_server_name, client_cert=cert, client_private_key=key
        )
        return {"tls": tls, "api_key": api_key}


def _read_pem(path: Path | None, variable: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as error:
        raise BadSettings(
            f"cannot read {path}, named by {variable} ({error.strerror}); fix {variable}"
        ) from error


class _LegacyNames(PydanticBaseSettingsSource):
    """The pre-section names, from the environment and the .env file, below the sectioned names."""

    def __init__(self, settings_cls: type[BaseSettings], *sources: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        # Highest priority first, as pydantic-settings orders sources: the environment, then .env.
        self.sources = [s for s in sources if isinstance(s, EnvSettingsSource)]

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ does the work

    def __call__(self) -> dict[str, Any]:
        values: dict[str, dict[str, str]] = {}
        for name, (section, key) in LEGACY_NAMES.items():
            for source in self.sources:
                value = source.env_vars.get(name.lower())
                if value is not None:
                    values.setdefault(section, {})[key] = value
                    break
        return values


class Settings(BaseSettings):
    """Everything Daedalus is configured with. Build it with `Settings.load()` at an entry point."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_file=".env",
        env_nested_delimiter="_",
        env_nested_max_split=1,
        extra="ignore",
    )
    sections: ClassVar[tuple[str, ...]] = ("database", "temporal", "agent", "api", "slack", "engines")

    home: Path = Field(
        default=Path(".daedalus"), description="embedded state: Temporal's and the store's SQLite"
    )
    host: str = Field(default="local", description="the GPU host this machine's host worker serves")
    artifacts: Path | None = Field(
        default=None, description="the artifact directory; None = <home>/artifacts"
    )
    hosts_file: Path = Field(
        default=REPO_ROOT / "examples" / "hosts.yaml",
        description="the host registry (hosts.yaml); the demo's is examples/hosts.yaml",
    )
    policy_file: Path | None = Field(
        default=None,
        description="the server's policy (policy.yaml: people, roles, host operators, standing delegations); "
        "None = a single-user stack where a spec's own approval rules are trusted; the demo's is "
        "examples/policy.yaml",
    )
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    temporal: TemporalSettings = Field(default_factory=TemporalSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    engines: EngineSettings = Field(default_factory=EngineSettings)
    steps: StepSettings = Field(default_factory=StepSettings)
    audit: AuditSettings = Field(default_factory=AuditSettings)

    @field_validator("home", "artifacts", "hosts_file", "policy_file")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        # Worktrees and git run from other directories: a relative path would point somewhere else there.
        return path.expanduser().resolve() if path is not None else None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        legacy = _LegacyNames(settings_cls, env_settings, dotenv_settings)
        return init_settings, env_settings, dotenv_settings, legacy, file_secret_settings

    @classmethod
    def load(cls, env_file: Path | str | None = ".env", **values: Any) -> Settings:
        """Read the environment and `env_file` (None: no file); a bad value raises BadSettings naming its variable."""
        try:
            return cls(_env_file=env_file, **values)
        except ValidationError as error:
            raise BadSettings(_explain(error)) from error
        except SettingsError as error:
            raise BadSettings(_explain_json(error, env_file)) from error

    @property
    def store_url(self) -> str:
        return self.database.url or f"sqlite:///{self.home / 'daedalus.db'}"

    @property
    def artifact_dir(self) -> Path:
        return self.artifacts or self.home / "artifacts"

    def audit_key(self, *, create: bool = False) -> AuditKey | None:
        """The key audit events are sealed with (made under home on a writer's first start, with `create`)."""
        return AuditKey.of(self.audit, self.home, create=create)


def variable(loc: tuple[str | int, ...]) -> str:
    """The environment variable behind a field's location, with its older name where there is one."""
    parts = [str(part) for part in loc[:2]] if loc and loc[0] in Settings.sections else [str(loc[0])]
    name = PREFIX + "_".join(parts).upper()
    older = [old for old, target in LEGACY_NAMES.items() if list(target) == parts]
    return f"{name} (or {older[0]})" if older else name


def _explain(error: ValidationError) -> str:
    lines = [f"the Daedalus settings have {error.error_count()} bad value(s); fix the environment or .env:"]
    for problem in error.errors():
        given = problem.get("input")
        shown = "" if isinstance(given, dict | list) else f" (got {given!r})"
        message = problem["msg"].removeprefix("Value error, ")
        lines.append(f"  - {variable(problem['loc'])}: {message}{shown}")
    return "\n".join(lines)


def _explain_json(error: SettingsError, env_file: Path | str | None) -> str:
    """pydantic-settings names only the section whose JSON failed to parse: find the variable itself."""
    sources: list[EnvSettingsSource] = [EnvSettingsSource(Settings)]
    if env_file is not None and Path(env_file).is_file():
        sources.append(DotEnvSettingsSource(Settings, env_file=env_file))
    bad = []
    for section in Settings.sections:
        model = Settings.model_fields[section].annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for name, field in model.model_fields.items():
            if not any(kind in str(field.annotation) for kind in ("dict", "list")):
                continue
            env = variable((section, name)).split(" ")[0]
            for source in sources:
                value = source.env_vars.get(env.lower())
                if value is None:
                    continue
                try:
                    json.loads(value)
                except ValueError as problem:
                    bad.append(f"  - {env}: not JSON ({problem}; got {value!r})")
                break
    detail = "\n".join(bad) or f"  - {error}"
    return "the Daedalus settings have a list or map that is not JSON; fix the environment or .env:\n" + (
        detail + '\n  (lists look like ["a", "b"], maps like {"U123": "wayne"})'
    )
