"""Where the agents live: binaries, endpoints and keys, from DAEDALUS_AGENT_* (tests point these at fakes)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr

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

    codex_bin: str = "codex"
    codex_args: list[str] = Field(
        default_factory=lambda: ["--sandbox", "workspace-write", "--skip-git-repo-check"],
        description="extra flags for `codex exec`, before the prompt",
    )
    claude_bin: str = "claude"
    claude_args: list[str] = Field(
        default_factory=lambda: ["--permission-mode", "acceptEdits"],
        description="extra flags for `claude -p`",
    )
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
    request_timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=3, ge=0, description="SDK retries on 429/5xx/timeouts, with backoff")
    max_tokens: int = Field(default=8192, gt=0)
    idle_timeout_s: int = Field(default=600, gt=0)
    max_turns: int = Field(default=40, ge=1)
    shell_timeout_s: float = Field(default=600.0, gt=0)
    deny_commands: list[str] = Field(default_factory=lambda: list(DEFAULT_DENY))
    lead_provider: str = Field(default="anthropic", pattern="^(anthropic|openai)$")
    lead_model: str | None = None
