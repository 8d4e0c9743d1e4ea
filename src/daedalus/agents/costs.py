"""Token usage and dollars for one attempt: provider-reported, estimated from a price table, or unavailable."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from daedalus.errors import BudgetExceeded
from daedalus.schemas.agents import AgentUsage, CostSource

PRICES_AS_OF = "2025-10"


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cached_input: float


# List prices as published by the providers; an estimate, never a bill. Longest prefix wins.
PRICES: dict[str, Price] = {
    "gpt-5-codex": Price(1.25, 10.0, 0.125),
    "gpt-5-mini": Price(0.25, 2.0, 0.025),
    "gpt-5-nano": Price(0.05, 0.40, 0.005),
    "gpt-5": Price(1.25, 10.0, 0.125),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1": Price(2.0, 8.0, 0.50),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "gpt-4o": Price(2.50, 10.0, 1.25),
    "o4-mini": Price(1.10, 4.40, 0.275),
    "o3": Price(2.0, 8.0, 0.50),
    "claude-opus-4": Price(15.0, 75.0, 1.50),
    "claude-sonnet-4": Price(3.0, 15.0, 0.30),
    "claude-3-7-sonnet": Price(3.0, 15.0, 0.30),
    "claude-haiku-4": Price(1.0, 5.0, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.0, 0.08),
}


def price_for(model: str | None) -> Price | None:
    if not model:
        return None
    name = model.lower().split("/")[-1]
    matches = [key for key in PRICES if name.startswith(key)]
    return PRICES[max(matches, key=len)] if matches else None


class CostMeter:
    """Adds up one attempt's usage, persists it after every update, and enforces the attempt's budget.

    Cost is provider-reported when the provider says it, estimated from `PRICES` when the model is known and
    the endpoint is a paid one, and unavailable otherwise (a self-hosted model, an unknown model) — never $0.00.
    """

    def __init__(
        self, *, model: str | None, budget_usd: float | None, path: Path | None, priced: bool = True
    ):
        self.model = model
        self.budget_usd = budget_usd
        self.path = path
        self.priced = priced
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_input_tokens = 0
        self.turns = 0
        self.provider_cost: float | None = None
        self.reported = False  # no usage reported at all is "unavailable", never $0.00

    def add(
        self,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cached_input_tokens: int = 0,
        turns: int = 0,
        model: str | None = None,
    ) -> None:
        """Record usage, then raise BudgetExceeded if the attempt has now spent more than its budget."""
        self.model = model or self.model
        self.reported = True
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cached_input_tokens += cached_input_tokens
        self.turns += turns
        self._after_update()

    def set_totals(self, *, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0) -> None:
        """The provider's own totals replace what was added up from the stream."""
        self.reported = True
        self.input_tokens, self.output_tokens = input_tokens, output_tokens
        self.cached_input_tokens = cached_input_tokens
        self._after_update()

    def cost(self) -> tuple[float | None, CostSource]:
        if self.provider_cost is not None:
            return self.provider_cost, "provider"
        price = price_for(self.model) if self.priced else None
        if price is None or not self.reported:
            return None, "unavailable"
        uncached = max(0, self.input_tokens - self.cached_input_tokens)
        usd = (
            uncached * price.input
            + self.cached_input_tokens * price.cached_input
            + self.output_tokens * price.output
        ) / 1e6
        return round(usd, 6), "estimated"

    def usage(self) -> AgentUsage:
        cost, source = self.cost()
        return AgentUsage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_input_tokens=self.cached_input_tokens,
            cost_usd=cost,
            cost_source=source,
            model=self.model,
            turns=self.turns,
        )

    def budget_note(self) -> str:
        """Why a budget could not be enforced, if it could not."""
        if self.budget_usd is not None and self.cost()[0] is None:
            return f"budget ${self.budget_usd:.2f} not enforceable: no price known for model {self.model!r}"
        return ""

    def _after_update(self) -> None:
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(self.usage().model_dump_json())
            tmp.replace(self.path)
        cost, source = self.cost()
        if self.budget_usd is not None and cost is not None and cost > self.budget_usd:
            raise BudgetExceeded(
                f"attempt spent ${cost:.4f} ({source}), over its budget of ${self.budget_usd:.2f};"
                " raise agent.budget_usd in the spec to allow more"
            )


def load_usage(path: Path) -> AgentUsage | None:
    """Usage persisted by a meter whose worker is gone."""
    try:
        return AgentUsage.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
