"""The lead agent drafts validated specs and narrative lines; without a key it says so and still answers."""

from __future__ import annotations

import json

from daedalus.agents.lead import LeadAgent
from daedalus.agents.settings import AgentSettings
from daedalus.schemas.agents import SpecDraftRequest
from daedalus.schemas.ticket import TicketSpec
from tests.agents.fakes import API_KEY, Script, Turn, serve

GOOD = {
    "id": "ignored",
    "title": "TQ workspace OOM fix",
    "host": "mavis",
    "kind": "fix",
    "engine": {"name": "1cat-vllm", "kind": "vllm", "repo": "/srv/1cat-vllm"},
    "agent": {"name": "codex"},
    "spec": "Bound the TQ decode workspace so 32K context does not OOM.",
}


async def test_draft_is_validated_and_repaired_once() -> None:
    bad = {**GOOD, "kind": "rewrite-everything"}
    script = Script(turns=[Turn(text=f"Here you go: {json.dumps(bad)}"), Turn(text=json.dumps(GOOD))])
    with serve(script) as url:
        lead = LeadAgent(AgentSettings(anthropic_base_url=url, anthropic_api_key=API_KEY))  # type: ignore[arg-type]
        draft = await lead.draft_spec(SpecDraftRequest(request="fix the TQ OOM at 32K", ticket_id="5"))
    assert draft.spec_json is not None, draft.problems
    spec = TicketSpec.model_validate_json(draft.spec_json)
    assert spec.id == "5" and spec.engine is not None and spec.engine.name == "1cat-vllm"
    assert "not a valid spec" in str(script.requests[1]["messages"])
    assert draft.usage.turns == 2 and draft.usage.cost_source == "estimated"


async def test_without_key_the_lead_says_so_and_narrative_falls_back() -> None:
    lead = LeadAgent(AgentSettings(anthropic_api_key=None))  # type: ignore[arg-type]
    draft = await lead.draft_spec(SpecDraftRequest(request="anything"))
    assert draft.spec_json is None and "no API key" in draft.problems[0]
    facts = ["ticket 4 PASS at 56.0 tok/s", "ticket 5 dispatched to codex"]
    story = await lead.narrative(facts)
    assert story.lines == facts and not story.by_model and "DAEDALUS_AGENT_ANTHROPIC_API_KEY" in story.note


async def test_narrative_by_model_over_openai_protocol() -> None:
    script = Script(turns=[Turn(text="- Ticket 4 passed its gate at 56.0 tok/s.\n- Ticket 5 is with Codex.")])
    with serve(script) as url:
        lead = LeadAgent(
            AgentSettings(
                lead_provider="openai",
                openai_base_url=f"{url}/v1",  # type: ignore[arg-type]
                openai_api_key=API_KEY,
            )
        )
        story = await lead.narrative(["ticket 4 PASS 56.0", "ticket 5 dispatched"])
    assert story.by_model and story.lines == [
        "Ticket 4 passed its gate at 56.0 tok/s.",
        "Ticket 5 is with Codex.",
    ]
