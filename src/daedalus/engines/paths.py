"""Where engine builds, fetched sources and generated models are cached: the `engines` settings section.

The entry point that builds the settings (the CLI, a worker, a test session, a bench script) hands this
section to `configure` once; the engine code below asks `cache_root()` and never reads the environment.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from daedalus.paths import REPO_ROOT


class EngineSettings(BaseModel):
    """The `engines` section of daedalus.config.Settings (DAEDALUS_ENGINES_*; DAEDALUS_CACHE_DIR still works)."""

    model_config = ConfigDict(extra="forbid")

    cache_dir: Path = Field(
        default=REPO_ROOT / ".cache", description="llama.cpp builds, fetched sources, generated models"
    )
    llama_cpp_python_version: str = Field(
        default="0.3.36", description="the llama-cpp-python sdist whose vendored llama.cpp is built"
    )

    @field_validator("cache_dir")
    @classmethod
    def _absolute(cls, path: Path) -> Path:
        return path.expanduser().resolve()

    @property
    def llama_source(self) -> Path:
        """The tree `scripts/fetch_llama_cpp.sh` unpacks (the llama-cpp-python sdist's vendored llama.cpp)."""
        version = self.llama_cpp_python_version
        return self.cache_dir / "src" / f"llama-cpp-python-{version}" / "vendor" / "llama.cpp"


_configured = EngineSettings()


def configure(settings: EngineSettings) -> None:
    """Set this process's engine cache, once, from the settings its entry point built."""
    global _configured
    _configured = settings


def cache_root() -> Path:
    """The configured cache directory (`<repo>/.cache`, git-ignored, until an entry point says otherwise)."""
    return _configured.cache_dir


def default_llama_source() -> Path:
    return _configured.llama_source
