"""Where the agents live: binaries, endpoints and keys, from DAEDALUS_AGENT_*."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

DEFAULT_DENY = [
    r"\bsudo\b",
    r"\bsu\b\s",
    r"\b(ssh|scp|rsync|curl|wget|nc|ncat|telnet)\b",
    r"\bgit\s+(push|remote|worktree|config|reset\s+--hard\s+\S|filter-branch|gc)\b",
    r"\brm\s+(-\w*\s+)*(/|~)(\s|$)",
    r"\b(mkfs|dd|shutdown|reboot|halt|poweroff|chown|mount|umount)\b",
    r"\b(kill|pkill|killall)\b",
    r"\bpip\s+install\b",
    r":\(\)\s*\{",
]


class AgentSettings(BaseModel):
    """The `agent` section of daedalus.config.Settings (DAEDALUS_AGENT_*; OPENAI_API_KEY and ANTHROPIC_API_KEY
    are honoured when the prefixed names are unset)."""

    model_config = ConfigDict(extra="forbid")

    codex_bin: str = Field(
        default="codex",
        description="the Codex CLI: a path, or a name looked up among the CLIs `make agent-clis` installed "
        "(<cache>/agent-clis/<lock hash>/bin), then on PATH",
    )
    codex_args: list[str] = Field(
        default_factory=lambda: ["--skip-git-repo-check"],
        description="extra flags for `codex exec`, before the prompt (approvals and Codex's own sandbox are "
        "set in the config Daedalus writes: Daedalus's sandbox confines it)",
    )
    claude_bin: str = Field(
        default="claude",
        description="Claude Code: a path, or a name looked up like codex_bin",
    )
    claude_args: list[str] = Field(default_factory=list, description="extra flags for `claude -p`")
    claude_budget_flag: bool = Field(default=True, description="pass --max-budget-usd to claude as well")
    openai_base_url: str | None = None
    openai_api_key: SecretStr | None = None
    openai_model: str = "gpt-5-codex"
    openai_priced: bool | None = Field(
        default=None, description="estimate cost from the price table; None = only for api.openai.com"
    )
    anthropic_base_url: str | None = None
    anthropic_api_key: SecretStr | None = None
    anthropic_model: str = "claude-sonnet-4-5"
    anthropic_priced: bool | None = Field(
        default=None,
        description="count Claude Code's own cost (and estimate one from the price table); None = only for "
        "api.anthropic.com",
    )
    request_timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=3, ge=0, description="SDK retries on 429/5xx/timeouts, with backoff")
    max_tokens: int = Field(default=8192, gt=0)
    idle_timeout_s: int = Field(default=600, gt=0)
    max_turns: int = Field(default=40, ge=1)
    shell_timeout_s: float = Field(default=600.0, gt=0)
    deny_commands: list[str] = Field(default_factory=lambda: list(DEFAULT_DENY))
    sandbox_read_only: list[str] = Field(
        default_factory=list,
        description="host paths (absolute) every agent sandbox also sees read-only, e.g. where codex, claude "
        "or node are installed outside /usr, or a CUDA toolkit",
    )
    sandbox_writable: list[str] = Field(
        default_factory=list,
        description="host paths (absolute) every agent sandbox may also write, e.g. a ccache",
    )
    sandbox_pass_env: list[str] = Field(
        default_factory=list,
        description="names of worker environment variables passed into agent sandboxes (nothing else is, "
        "besides a CLI agent's own provider key); never name a token or another provider's key here",
    )
    sandbox_cli_network: bool = Field(
        default=True,
        description="let codex/claude reach their model endpoint, and nothing else (daedalus.egress: the "
        "sandbox keeps no network of its own; a gateway admits only the endpoint); false: no way out at all. "
        "Tool-loop shells and scripted commands never get it",
    )

    @field_validator("sandbox_pass_env")
    @classmethod
    def _no_credentials_into_sandboxes(cls, names: list[str]) -> list[str]:
        credentials = [
            n for n in names if re.search(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|CREDENTIAL", n, re.I)
        ]
        if credentials:
            raise ValueError(
                f"DAEDALUS_AGENT_SANDBOX_PASS_ENV names {credentials}, which look like credentials; agent "
                "sandboxes never get those (a CLI agent gets its own provider's key from its own setting)"
            )
        return names

    lead_provider: str = Field(default="anthropic", pattern="^(anthropic|openai)$")
    lead_model: str | None = None
