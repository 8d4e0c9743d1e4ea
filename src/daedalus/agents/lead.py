"""The lead agent: drafts a TicketSpec from a short request, and writes the narrative lines of reports.

With no API key it says so: drafting returns the reason instead of a spec, and the narrative falls back to
the facts as given, so the rest of Daedalus keeps working.
"""

from __future__ import annotations

import json
import re

import anthropic
import openai
from pydantic import ValidationError

from daedalus.agents.costs import CostMeter
from daedalus.agents.settings import AgentSettings
from daedalus.errors import LeadUnavailable
from daedalus.schemas.agents import Narrative, SpecDraft, SpecDraftRequest
from daedalus.schemas.ticket import TicketSpec

DRAFT_SYSTEM = (
    "You are the lead of an ML-inference team. Turn the request into one ticket spec as a single JSON object "
    "matching this JSON schema, and output only the JSON. Keep `spec` concrete: what to change, how it is "
    "measured, what must not regress.\n"
)
NARRATIVE_SYSTEM = (
    "You write the narrative lines of an engineering progress report. One line per fact given, plain and "
    "specific, no new facts, no numbers that are not in the input. Output one line per row, nothing else."
)
JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


class LeadAgent:
    def __init__(self, settings: AgentSettings):
        self.settings = settings

    @property
    def provider(self) -> str:
        return self.settings.lead_provider

    def model(self) -> str:
        if self.settings.lead_model:
            return self.settings.lead_model
        return self.settings.anthropic_model if self.provider == "anthropic" else self.settings.openai_model

    def unavailable_reason(self) -> str | None:
        key = (
            self.settings.anthropic_api_key if self.provider == "anthropic" else self.settings.openai_api_key
        )
        if key is None:
            env = (
                "DAEDALUS_AGENT_ANTHROPIC_API_KEY"
                if self.provider == "anthropic"
                else "DAEDALUS_AGENT_OPENAI_API_KEY"
            )
            return f"the lead agent has no API key ({self.provider}): set {env}, or write the spec by hand"
        return None

    async def complete(self, system: str, user: str, meter: CostMeter) -> str:
        """One model call; raises LeadUnavailable with the reason when it cannot be made."""
        reason = self.unavailable_reason()
        if reason:
            raise LeadUnavailable(reason)
        s = self.settings
        try:
            if self.provider == "anthropic":
                assert s.anthropic_api_key is not None
                async with anthropic.AsyncAnthropic(
                    api_key=s.anthropic_api_key.get_secret_value(),
                    base_url=s.anthropic_base_url,
                    timeout=s.request_timeout_s,
                    max_retries=s.max_retries,
                ) as client:
                    message = await client.messages.create(
                        model=self.model(),
                        max_tokens=s.max_tokens,
                        system=system,
                        messages=[{"role": "user", "content": user}],
                    )
                meter.add(
                    input_tokens=message.usage.input_tokens,
                    output_tokens=message.usage.output_tokens,
                    turns=1,
                    model=message.model,
                )
                return "".join(b.text for b in message.content if b.type == "text")
            assert s.openai_api_key is not None
            async with openai.AsyncOpenAI(
                api_key=s.openai_api_key.get_secret_value(),
                base_url=s.openai_base_url,
                timeout=s.request_timeout_s,
                max_retries=s.max_retries,
            ) as oclient:
                completion = await oclient.chat.completions.create(
                    model=self.model(),
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                )
            if completion.usage:
                meter.add(
                    input_tokens=completion.usage.prompt_tokens,
                    output_tokens=completion.usage.completion_tokens,
                    turns=1,
                    model=completion.model,
                )
            return completion.choices[0].message.content or ""
        except (anthropic.AnthropicError, openai.OpenAIError) as error:
            raise LeadUnavailable(
                f"the lead agent's model call failed ({self.provider} {self.model()}): {error}"
            ) from error

    async def draft_spec(self, request: SpecDraftRequest) -> SpecDraft:
        """A validated draft, or the problems that kept it from validating (one repair round)."""
        meter = CostMeter(model=self.model(), budget_usd=None, path=None)
        lead = f"lead agent ({self.provider} {self.model()})"
        schema = json.dumps(TicketSpec.model_json_schema())
        hints = {k: v for k, v in (("id", request.ticket_id), ("host", request.host)) if v}
        prompt = request.request + (f"\n\nUse these fields as given: {json.dumps(hints)}" if hints else "")
        if request.lessons:
            # What the team learned on this host and engine goes into the draft's constraints where it applies.
            prompt += (
                "\n\nLessons the team recorded (turn the relevant ones into constraints):\n"
                + "\n".join(f"- {lesson}" for lesson in request.lessons)
            )
        problems: list[str] = []
        try:
            for _ in range(2):
                text = await self.complete(DRAFT_SYSTEM + schema, prompt, meter)
                match = JSON_OBJECT.search(text)
                try:
                    if match is None:
                        raise ValueError("the answer holds no JSON object")
                    spec = TicketSpec.model_validate_json(match.group(0))
                    spec = spec.model_copy(update=hints) if hints else spec
                    return SpecDraft(spec_json=spec.model_dump_json(), lead=lead, usage=meter.usage())
                except (ValidationError, ValueError) as error:
                    problems = [str(error)[:1500]]
                    prompt = (
                        f"{prompt}\n\nYour previous answer was not a valid spec:\n{problems[0]}\n"
                        "Answer again with corrected JSON only."
                    )
        except LeadUnavailable as error:
            return SpecDraft(problems=[str(error)], lead=str(error), usage=meter.usage())
        return SpecDraft(problems=problems, lead=lead, usage=meter.usage())

    async def narrative(self, facts: list[str]) -> Narrative:
        """Narrative lines over the report's facts; without a model, the facts themselves, said so."""
        meter = CostMeter(model=self.model(), budget_usd=None, path=None)
        if not facts:
            return Narrative(lines=[], by_model=False, note="nothing to narrate")
        try:
            text = await self.complete(NARRATIVE_SYSTEM, "\n".join(f"- {f}" for f in facts), meter)
        except LeadUnavailable as error:
            return Narrative(lines=list(facts), by_model=False, note=str(error), usage=meter.usage())
        lines = [ln.strip().lstrip("-* ").strip() for ln in text.splitlines() if ln.strip()]
        return Narrative(
            lines=lines or list(facts),
            by_model=bool(lines),
            usage=meter.usage(),
            note="" if lines else "the model returned nothing; showing the facts",
        )
