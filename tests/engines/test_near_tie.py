"""The near-tie rule on recorded /v1/completions logprob streams: each case can fail, none needs a server.

The streams are the exact JSON shapes the two engines answer with: vLLM's OpenAI-legacy `logprobs`
(`tokens` as "token_id:N" with return_tokens_as_token_ids, `top_logprobs` as dicts) and llama.cpp's
(`logprobs.content[]` with ids and `top_logprobs[]`).
"""

from __future__ import annotations

import pytest

from daedalus.engines.openai_api import ApiError, parse_logprobs
from daedalus.engines.quality import SEED_PROBE_COUNT, identity_probes, identity_result, judge_identity
from daedalus.gates.verdicts import judge
from daedalus.schemas.engines import GreedyStream, IdentityProbe, ProbeOutcome
from daedalus.schemas.gates import GateMeasurement, GateSpec, Verdict

FRANCE = IdentityProbe(name="france", prompt="The capital of France is", expect="Paris")
PLAIN = IdentityProbe(name="plain", prompt="people say that each day")


def vllm_choice(tokens: list[tuple[int, str, float, int, float]]) -> dict[str, object]:
    """A vLLM /v1/completions choice: per step (id, text, logprob, runner-up id, runner-up logprob)."""
    return {
        "index": 0,
        "text": "".join(t[1] for t in tokens),
        "logprobs": {
            "text_offset": list(range(len(tokens))),
            "token_logprobs": [t[2] for t in tokens],
            "tokens": [f"token_id:{t[0]}" for t in tokens],
            "top_logprobs": [{f"token_id:{t[0]}": t[2], f"token_id:{t[3]}": t[4]} for t in tokens],
        },
        "finish_reason": "length",
        "stop_reason": None,
    }


def llama_choice(tokens: list[tuple[int, str, float, int, float]]) -> dict[str, object]:
    """A llama-server /v1/completions choice with logprobs (non-streamed)."""
    return {
        "text": "".join(t[1] for t in tokens),
        "index": 0,
        "logprobs": {
            "content": [
                {
                    "id": t[0], "token": t[1], "bytes": list(t[1].encode()), "logprob": t[2],
                    "top_logprobs": [
                        {"id": t[0], "token": t[1], "bytes": list(t[1].encode()), "logprob": t[2]},
                        {"id": t[3], "token": "?", "bytes": [63], "logprob": t[4]},
                    ],
                }
                for t in tokens
            ]
        },
        "finish_reason": "length",
    }  # fmt: skip


def stream(choice: dict[str, object]) -> GreedyStream:
    return parse_logprobs(str(choice["text"]), choice["logprobs"])


AR = [(12366, " Paris", -0.05, 4402, -3.1), (13, ".", -0.4, 11, -0.6), (578, " The", -0.9, 1102, -1.1)]


def diverged_at_1(gap: float, second_text: str = ",") -> list[tuple[int, str, float, int, float]]:
    return [AR[0], (11, second_text, -0.5, 13, -0.5 - gap), AR[2]]


@pytest.mark.parametrize("dialect", [vllm_choice, llama_choice], ids=["vllm", "llama.cpp"])
def test_no_divergence_passes(dialect) -> None:  # type: ignore[no-untyped-def]
    judged = judge_identity(FRANCE, stream(dialect(AR)), stream(dialect(AR)))
    assert judged.passed and judged.outcome is ProbeOutcome.IDENTICAL


@pytest.mark.parametrize("dialect", [vllm_choice, llama_choice], ids=["vllm", "llama.cpp"])
@pytest.mark.parametrize(("gap", "passes"), [(0.20, True), (0.30, False), (0.25, False)])
def test_divergence_passes_only_as_a_near_tie(dialect, gap: float, passes: bool) -> None:  # type: ignore[no-untyped-def]
    # The baseline (AR) had " ." vs "," at position 1 with a top-2 gap of `gap`; the candidate took ",".
    baseline = [AR[0], (13, ".", -0.5, 11, -0.5 - gap), AR[2]]
    judged = judge_identity(PLAIN, stream(dialect(diverged_at_1(gap))), stream(dialect(baseline)))
    assert judged.passed is passes and judged.first_divergence == 1
    assert judged.logprob_gap == pytest.approx(gap)
    assert judged.outcome is (ProbeOutcome.NEAR_TIE if passes else ProbeOutcome.DIVERGED)


@pytest.mark.parametrize("dialect", [vllm_choice, llama_choice], ids=["vllm", "llama.cpp"])
def test_a_lost_answer_fails_whatever_the_gap(dialect) -> None:  # type: ignore[no-untyped-def]
    # A near-tie flip at token 0 (gap 0.05) that turns "Paris" into "Lyon": the probe no longer holds.
    baseline = [(12366, " Paris", -0.70, 40827, -0.75), *AR[1:]]
    candidate = [(40827, " Lyon", -0.70, 12366, -0.75), *AR[1:]]
    judged = judge_identity(FRANCE, stream(dialect(candidate)), stream(dialect(baseline)))
    assert not judged.passed and judged.outcome is ProbeOutcome.ANSWER_LOST
    assert judged.logprob_gap == pytest.approx(0.05) and "'Paris' no longer holds" in judged.detail


def test_a_needle_whose_secret_is_gone_fails() -> None:
    needle = next(p for p in identity_probes() if p.name.startswith("needle"))
    assert needle.expect is not None
    baseline = [(1, f" {needle.expect}", -0.1, 2, -0.15)]
    candidate = [(3, " 1234" if needle.expect != "1234" else " 4321", -0.1, 1, -0.15)]
    judged = judge_identity(needle, stream(vllm_choice(candidate)), stream(vllm_choice(baseline)))
    assert judged.outcome is ProbeOutcome.ANSWER_LOST


def test_an_unknown_gap_is_not_a_near_tie() -> None:
    base = GreedyStream(text=" Paris.", token_ids=[1, 2], top2_gaps=[None, None])
    cand = GreedyStream(text=" Paris,", token_ids=[1, 3], top2_gaps=[None, None])
    judged = judge_identity(FRANCE, cand, base)
    assert not judged.passed and "unknown" in judged.detail


def test_strings_instead_of_token_ids_are_refused_with_the_fix() -> None:
    with pytest.raises(ApiError, match="return_tokens_as_token_ids"):
        parse_logprobs(" Paris", {"tokens": [" Paris"], "top_logprobs": [{" Paris": -0.1}]})


def test_the_probe_set_is_the_seeds_sixty_and_the_gate_needs_all() -> None:
    probes = identity_probes()
    assert len(probes) == SEED_PROBE_COUNT == 60 and len({p.prompt for p in probes}) == 60
    assert probes[0].expect == "Paris" and sum(p.name.startswith("needle") for p in probes) == 6
    same = [judge_identity(p, stream(vllm_choice(AR)), stream(vllm_choice(AR))) for p in probes]
    sure = [AR[0], (13, ".", -0.5, 11, -0.8), AR[2]]  # the baseline's gap at token 1 is 0.30
    flipped = judge_identity(PLAIN, stream(vllm_choice(diverged_at_1(0.30))), stream(vllm_choice(sure)))
    result = identity_result("mtp2", "ar", [*same[:59], flipped])
    assert not result.passed and result.identical == 59 and "1 failed of 60" in result.detail
    gate = GateSpec(name="identity", metric="temp0_identity", threshold=1.0, command="x")
    samples = [1.0 if j.passed else 0.0 for j in result.judgements]
    assert judge(gate, GateMeasurement(samples=samples)).verdict is Verdict.FAIL
    assert judge(gate, GateMeasurement(samples=[1.0] * 60)).verdict is Verdict.PASS
