"""Quality probes: temp-0 identity with the near-tie rule, needle in a haystack, perplexity, garbage."""

from __future__ import annotations

import random
import re
import zlib
from collections import Counter
from pathlib import Path

import httpx

from daedalus.engines.base import Server
from daedalus.engines.llama_build import LlamaBuild
from daedalus.engines.process import run_logged, tail
from daedalus.engines.tiny_model import _WORDS
from daedalus.errors import EngineError
from daedalus.gates.statistics import clopper_pearson
from daedalus.schemas.engines import (
    GarbageFinding,
    GarbageKind,
    LlamaCppPreset,
    NeedleResult,
    NeedleTrial,
    PerplexityResult,
    Temp0Result,
)

NEAR_TIE_GAP = 0.25
_PPL = re.compile(r"Final estimate: PPL = (?P<ppl>[\d.]+) \+/- (?P<err>[\d.]+)")

PROBE_PROMPTS = (
    "The capital of France is",
    "the secret number is hidden in the long answer",
    "people say that each day the work is good",
    "first make the key value then come back",
)


async def greedy(server: Server, prompt: str, n_tokens: int, client: httpx.AsyncClient) -> dict[str, object]:
    """llama.cpp's native /completion at temperature 0, with token ids and the top-2 logprobs per step."""
    body = {
        "prompt": prompt,
        "n_predict": n_tokens,
        "temperature": 0.0,
        "top_k": 1,
        "n_probs": 2,
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
        "seed": 0,
    }
    response = await client.post(server.base_url + "/completion", json=body)
    if response.status_code != 200:
        raise EngineError(
            f"{server.adapter.preset.name}: /completion answered {response.status_code}: "
            f"{response.text[:300]}"
        )
    data: dict[str, object] = response.json()
    return data


def _top2_gap(step: dict[str, object]) -> float | None:
    tops = step.get("top_logprobs")
    if not isinstance(tops, list) or len(tops) < 2:
        return None
    return float(tops[0]["logprob"]) - float(tops[1]["logprob"])


async def temp0_identity(
    candidate: Server, baseline: Server, *, prompts: tuple[str, ...] = PROBE_PROMPTS, n_tokens: int = 48
) -> Temp0Result:
    """Token-id identity with the baseline; a divergence passes only as a near-tie (baseline gap < 0.25)."""
    identical = near_ties = 0
    failure: Temp0Result | None = None
    async with httpx.AsyncClient(timeout=120.0) as client:
        for prompt in prompts:
            cand = await greedy(candidate, prompt, n_tokens, client)
            base = await greedy(baseline, prompt, n_tokens, client)
            cand_ids = list(cand.get("tokens") or [])  # type: ignore[call-overload]
            base_ids = list(base.get("tokens") or [])  # type: ignore[call-overload]
            if not cand_ids or not base_ids:
                raise EngineError("the server returned no token ids; it must support return_tokens")
            if cand_ids == base_ids:
                identical += 1
                continue
            pos = next(
                (i for i, (a, b) in enumerate(zip(cand_ids, base_ids, strict=False)) if a != b),
                min(len(cand_ids), len(base_ids)),
            )
            probs = base.get("completion_probabilities") or []
            gap = _top2_gap(probs[pos]) if isinstance(probs, list) and pos < len(probs) else None
            if gap is not None and gap < NEAR_TIE_GAP:
                near_ties += 1
            elif failure is None:
                failure = Temp0Result(
                    preset=candidate.adapter.preset.name,
                    baseline_preset=baseline.adapter.preset.name,
                    prompts=len(prompts), identical=0, near_ties=0, passed=False,
                    first_divergence=pos, logprob_gap=gap,
                    candidate_text=str(cand.get("content", "")), baseline_text=str(base.get("content", "")),
                    detail=f"prompt {prompt!r}: diverged at token {pos} with baseline top-2 gap "
                    f"{'unknown' if gap is None else f'{gap:.3f}'} (>= {NEAR_TIE_GAP} is not a near-tie)",
                )  # fmt: skip
    if failure is not None:
        return failure.model_copy(update={"identical": identical, "near_ties": near_ties})
    return Temp0Result(
        preset=candidate.adapter.preset.name,
        baseline_preset=baseline.adapter.preset.name,
        prompts=len(prompts),
        identical=identical,
        near_ties=near_ties,
        passed=True,
        detail=f"{identical} identical, {near_ties} near-tie flips of {len(prompts)} prompts",
    )


def haystack(length_words: int, depth: float, needle: str, seed: int) -> str:
    rng = random.Random(seed)
    words = [rng.choice(_WORDS) for _ in range(length_words)]
    at = int(depth * length_words)
    return " ".join([*words[:at], needle, *words[at:]])


async def needle_probe(
    server: Server,
    *,
    depths: tuple[float, ...] = (0.1, 0.5, 0.9),
    lengths: tuple[int, ...] = (64, 256),
    confidence: float = 0.90,
) -> NeedleResult:
    """A deterministic string match over depths x lengths; k/n with its Clopper-Pearson interval."""
    trials: list[NeedleTrial] = []
    async with httpx.AsyncClient(timeout=120.0) as client:
        for length in lengths:
            for depth in depths:
                secret = str(random.Random(f"{length}:{depth}").randint(1000, 9999))
                prompt = haystack(length, depth, f"the secret number is {secret} .", seed=length) + (
                    " what is the secret number ? the secret number is"
                )
                out = await greedy(server, prompt, 8, client)
                answer = str(out.get("content", ""))
                trials.append(
                    NeedleTrial(depth=depth, length_words=length, found=secret in answer, answer=answer)
                )
    found = sum(t.found for t in trials)
    low, high = clopper_pearson(found, len(trials), confidence)
    return NeedleResult(
        preset=server.adapter.preset.name,
        trials=trials,
        found=found,
        total=len(trials),
        ci_low=low,
        ci_high=high,
    )


def write_corpus(path: Path, words: int = 6000, seed: int = 7) -> Path:
    """A deterministic perplexity corpus of the tiny models' words."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(_WORDS) for _ in range(12)) + " ." for _ in range(words // 12)]
    path.write_text("\n".join(lines) + "\n")
    return path


def parse_perplexity(text: str) -> tuple[float, float]:
    m = _PPL.search(text)
    if m is None:
        raise EngineError("no 'Final estimate: PPL = x +/- e' line in llama-perplexity's output")
    return float(m["ppl"]), float(m["err"])


async def perplexity(
    build: LlamaBuild, preset: LlamaCppPreset, model: Path, corpus: Path, log_path: Path,
    *, ctx: int = 128, chunks: int = 8,
) -> tuple[float, float]:  # fmt: skip
    """llama-perplexity over `chunks` windows of `ctx` tokens, with the preset's KV cache types."""
    if not corpus.is_file():
        raise EngineError(f"perplexity corpus {corpus} does not exist")
    argv = [
        str(build.binary("llama-perplexity")), "-m", str(model), "-f", str(corpus),
        "-c", str(ctx), "--chunks", str(chunks), "-b", str(ctx),
        "-ctk", preset.cache_type_k, "-ctv", preset.cache_type_v, "-fa", preset.flash_attn,
    ]  # fmt: skip
    if preset.threads:
        argv += ["-t", str(preset.threads)]
    log_path.unlink(missing_ok=True)
    rc = await run_logged(argv, log_path, env=preset.env)
    if rc != 0:
        raise EngineError(f"llama-perplexity failed (exit {rc}); last lines of {log_path}:\n{tail(log_path)}")
    return parse_perplexity(log_path.read_text(errors="replace"))


async def perplexity_delta(
    build: LlamaBuild, candidate: LlamaCppPreset, baseline: LlamaCppPreset, model: Path, corpus: Path,
    workdir: Path,
) -> PerplexityResult:  # fmt: skip
    """dPPL in percent; its error adds both runs' relative errors in quadrature (conservative: the runs
    share weights and corpus, so their errors are positively correlated)."""
    ppl, err = await perplexity(build, candidate, model, corpus, workdir / f"ppl-{candidate.name}.log")
    base, base_err = await perplexity(build, baseline, model, corpus, workdir / f"ppl-{baseline.name}.log")
    delta = (ppl / base - 1) * 100
    delta_err = (ppl / base) * ((err / ppl) ** 2 + (base_err / base) ** 2) ** 0.5 * 100
    return PerplexityResult(
        preset=candidate.name, baseline_preset=baseline.name, ppl=ppl, ppl_err=err,
        baseline_ppl=base, baseline_ppl_err=base_err, delta_pct=delta, delta_err_pct=delta_err,
    )  # fmt: skip


def garbage(text: str, *, requested_tokens: int | None = None, completion_tokens: int | None = None
            ) -> list[GarbageFinding]:  # fmt: skip
    """Name what is wrong with a generation: digit soup, repetition, fragments, a dropped tail."""
    findings: list[GarbageFinding] = []
    visible = [c for c in text if not c.isspace()]
    if visible:
        digits = sum(c.isdigit() for c in visible) / len(visible)
        if digits > 0.3:
            findings.append(
                GarbageFinding(kind=GarbageKind.DIGIT_SOUP, detail=f"{digits:.0%} of characters are digits")
            )
    words = text.split()
    if len(words) >= 8:
        grams = Counter(tuple(words[i : i + 3]) for i in range(len(words) - 2))
        gram, count = grams.most_common(1)[0]
        covered = count * 3 / len(words)
        compress = len(zlib.compress(text.encode())) / max(len(text.encode()), 1)
        if covered > 0.5 or compress < 0.15:
            findings.append(GarbageFinding(
                kind=GarbageKind.REPETITION,
                detail=f"'{' '.join(gram)}' repeats {count}x ({covered:.0%} of words); zlib ratio {compress:.2f}",
            ))  # fmt: skip
    if words:
        short = sum(1 for w in words if len(w) <= 2 and not w.isdigit()) / len(words)
        if short > 0.5:
            findings.append(
                GarbageFinding(kind=GarbageKind.FRAGMENTS, detail=f"{short:.0%} of words are 1-2 characters")
            )
    if (
        requested_tokens is not None
        and completion_tokens is not None
        and completion_tokens < requested_tokens
    ):
        findings.append(GarbageFinding(
            kind=GarbageKind.DROPPED_TAIL, detail=f"stopped after {completion_tokens} of {requested_tokens} tokens"
        ))  # fmt: skip
    elif text and not text.strip():
        findings.append(GarbageFinding(kind=GarbageKind.DROPPED_TAIL, detail="the output is only whitespace"))
    return findings
