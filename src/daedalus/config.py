"""Settings, from the environment (DAEDALUS_*) or a .env file. Read at entry points; never inside workflows."""

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from daedalus.schemas.ticket import host_queue

CONTROL_QUEUE = "daedalus-control"
__all__ = ["CONTROL_QUEUE", "Settings", "host_queue"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DAEDALUS_", env_file=".env", extra="ignore")

    home: Path = Field(
        default=Path(".daedalus"), description="embedded state: Temporal's and the store's SQLite"
    )
    database_url: str | None = Field(default=None, description="e.g. postgresql+psycopg://host/db")
    temporal_address: str | None = Field(default=None, description="an existing cluster; None = embedded")
    temporal_port: int = 7233
    ui_port: int = 8233
    namespace: str = "default"
    control_queue: str = CONTROL_QUEUE
    host: str = Field(default="local", description="the GPU host this machine's host worker serves")
    artifacts: Path | None = None
    hosts_file: Path = Field(
        default=Path(__file__).resolve().parents[2] / "examples" / "hosts.yaml",
        description="the host registry (hosts.yaml); the demo's is examples/hosts.yaml",
    )

    @field_validator("home", "artifacts", "hosts_file")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        # Worktrees and git run from other directories: a relative path would point somewhere else there.
        return path.expanduser().resolve() if path is not None else None

    @property
    def store_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'daedalus.db'}"

    @property
    def artifact_dir(self) -> Path:
        return self.artifacts or self.home / "artifacts"

    @property
    def address(self) -> str:
        return self.temporal_address or f"127.0.0.1:{self.temporal_port}"
