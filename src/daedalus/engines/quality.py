"""Quality probes: temp-0 identity with the near-tie rule, needle in a haystack, perplexity, garbage."""

from __future__ import annotations

import random
import re
import zlib
from collections import Counter
from pathlib import Path

from daedalus.engines.base import Server
from daedalus.engines.engine_processes import run_teed
from daedalus.engines.llama_build import LlamaBuild
from daedalus.engines.tiny_model import _WORDS
from daedalus.errors import EngineError
from daedalus.gates.statistics import clopper_pearson
from daedalus.processes import log_tail
from daedalus.schemas.engines import (
    GarbageFinding,
    GarbageKind,
    GreedyStream,
    IdentityProbe,
    LlamaCppPreset,
    NeedleResult,
    NeedleTrial,
    PerplexityResult,
    ProbeJudgement,
    ProbeOutcome,
    Temp0Result,
)

NEAR_TIE_GAP = 0.25
_PPL = re.compile(r"Final estimate: PPL = (?P<ppl>[\d.]+) \+/- (?P<err>[\d.]+)")
SEED_PROBE_COUNT = 60  # ticket 6d: "bit-identical to AR (60/60)"
NEEDLE_DEPTHS = (0.1, 0.5, 0.9)
NEEDLE_LENGTHS = (64, 256)


def _needle_secret(length: int, depth: float) -> str:
    return str(random.Random(f"{length}:{depth}").randint(1000, 9999))


def needle_prompt(length: int, depth: float) -> tuple[str, str]:
    """A haystack with a secret at `depth`, and the secret."""
    secret = _needle_secret(length, depth)
    prompt = haystack(length, depth, f"the secret number is {secret} .", seed=length) + (
        " what is the secret number ? the secret number is"
    )
    return prompt, secret


def identity_probes(count: int = SEED_PROBE_COUNT) -> tuple[IdentityProbe, ...]:
    """The seed's temp-0 probe set, sized as ticket 6d's (60 prompts): France, needles at three depths x two
    lengths (each must keep its answer), and plain prompts of fresh words for the rest."""
    if count < 1:
        raise ValueError(f"a probe set needs at least one prompt; got {count}")
    probes = [IdentityProbe(name="france", prompt="The capital of France is", expect="Paris")]
    for length in NEEDLE_LENGTHS:
        for depth in NEEDLE_DEPTHS:
            prompt, secret = needle_prompt(length, depth)
            probes.append(IdentityProbe(name=f"needle-{length}w-{depth:.0%}", prompt=prompt, expect=secret))
    rng = random.Random(6)
    while len(probes) < count:
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 24)))
        probes.append(IdentityProbe(name=f"plain-{len(probes)}", prompt=words))
    return tuple(probes[:count])


def judge_identity(probe: IdentityProbe, candidate: GreedyStream, baseline: GreedyStream) -> ProbeJudgement:
    """The near-tie rule on one probe's recorded streams (MEASUREMENT.md, seed 6b/6c).

    Identical token ids pass. At the first divergence, a probe whose answer held on the baseline and is gone
    from the candidate fails whatever the gap; otherwise it passes only if the baseline's top-2 logprob gap
    there is < 0.25 (a near-tie flip). An unknown gap is not a near tie.
    """
    texts = {"candidate_text": candidate.text, "baseline_text": baseline.text}
    if candidate.token_ids == baseline.token_ids:
        return ProbeJudgement(probe=probe.name, outcome=ProbeOutcome.IDENTICAL, passed=True, **texts)
    pairs = zip(candidate.token_ids, baseline.token_ids, strict=False)
    pos = next((i for i, (a, b) in enumerate(pairs) if a != b),
               min(len(candidate.token_ids), len(baseline.token_ids)))  # fmt: skip
    gap = baseline.top2_gaps[pos] if pos < len(baseline.top2_gaps) else None
    where = f"diverged at token {pos}, baseline top-2 gap {'unknown' if gap is None else f'{gap:.3f}'}"
    if probe.expect is not None and probe.expect in baseline.text and probe.expect not in candidate.text:
        return ProbeJudgement(
            probe=probe.name, outcome=ProbeOutcome.ANSWER_LOST, passed=False, first_divergence=pos,
            logprob_gap=gap, detail=f"{probe.name}: {where}; the answer {probe.expect!r} no longer holds", **texts,
        )  # fmt: skip
    if gap is not None and gap < NEAR_TIE_GAP:
        return ProbeJudgement(
            probe=probe.name, outcome=ProbeOutcome.NEAR_TIE, passed=True, first_divergence=pos, logprob_gap=gap,
            detail=f"{probe.name}: {where} (< {NEAR_TIE_GAP}: a near-tie flip)", **texts,
        )  # fmt: skip
    return ProbeJudgement(
        probe=probe.name, outcome=ProbeOutcome.DIVERGED, passed=False, first_divergence=pos, logprob_gap=gap,
        detail=f"{probe.name}: {where} (>= {NEAR_TIE_GAP} or unknown is not a near tie)", **texts,
    )  # fmt: skip


def identity_result(preset: str, baseline_preset: str, judgements: list[ProbeJudgement]) -> Temp0Result:
    """The probe set's result: passed only if every probe passed; the first failure's evidence up front."""
    failed = [j for j in judgements if not j.passed]
    first = failed[0] if failed else None
    identical = sum(j.outcome is ProbeOutcome.IDENTICAL for j in judgements)
    near = sum(j.outcome is ProbeOutcome.NEAR_TIE for j in judgements)
    summary = (
        f"{identical} identical, {near} near-tie flips, {len(failed)} failed of {len(judgements)} probes"
    )
    return Temp0Result(
        preset=preset, baseline_preset=baseline_preset, prompts=len(judgements), identical=identical,
        near_ties=near, passed=not failed, judgements=judgements,
        first_divergence=first.first_divergence if first else None, logprob_gap=first.logprob_gap if first else None,
        candidate_text=first.candidate_text if first else "", baseline_text=first.baseline_text if first else "",
        detail=summary + (f"; first failure: {first.detail}" if first else ""),
    )  # fmt: skip


async def temp0_identity(
    candidate: Server,
    baseline: Server,
    *,
    probes: tuple[IdentityProbe, ...] | None = None,
    n_tokens: int = 48,
) -> Temp0Result:
    """Token-id identity with the baseline over the probe set (the seed's 60 by default), via /v1/completions
    with logprobs on both servers."""
    probe_set = probes or identity_probes()
    cand_streams = await greedy_streams(candidate, probe_set, n_tokens)
    base_streams = await greedy_streams(baseline, probe_set, n_tokens)
    judgements = [
        judge_identity(p, c, b) for p, c, b in zip(probe_set, cand_streams, base_streams, strict=True)
    ]
    return identity_result(candidate.adapter.preset.name, baseline.adapter.preset.name, judgements)


async def greedy_streams(
    server: Server, probes: tuple[IdentityProbe, ...], n_tokens: int = 48
) -> list[GreedyStream]:
    """Each probe's temp-0 completion with token ids and top-2 gaps, from the server's /v1/completions."""
    api = server.endpoint()
    streams = []
    for probe in probes:
        stream = await api.greedy(probe.prompt, n_tokens)
        if not stream.token_ids:
            raise EngineError(f"probe {probe.name}: {server.adapter.preset.name} returned no token ids")
        streams.append(stream)
    return streams


def haystack(length_words: int, depth: float, needle: str, seed: int) -> str:
    rng = random.Random(seed)
    words = [rng.choice(_WORDS) for _ in range(length_words)]
    at = int(depth * length_words)
    return " ".join([*words[:at], needle, *words[at:]])


async def needle_probe(
    server: Server,
    *,
    depths: tuple[float, ...] = NEEDLE_DEPTHS,
    lengths: tuple[int, ...] = NEEDLE_LENGTHS,
    confidence: float = 0.90,
) -> NeedleResult:
    """A deterministic string match over depths x lengths; k/n with its Clopper-Pearson interval."""
    api = server.endpoint()
    trials: list[NeedleTrial] = []
    for length in lengths:
        for depth in depths:
            prompt, secret = needle_prompt(length, depth)
            answer = (await api.greedy(prompt, 8)).text
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


PERPLEXITY_RUNS = 6


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
    # llama.cpp logs through a worker thread whose queue is not flushed when the process exits (its logger is
    # leaked on purpose, llama.cpp issue 22142): seen here, exit 0 with the chunk values up to the next-to-last
    # and no final estimate, more often on a loaded machine. The run is deterministic, so a run whose final
    # line went missing is run again, at most PERPLEXITY_RUNS times in all.
    for _ in range(PERPLEXITY_RUNS):
        log_path.unlink(missing_ok=True)
        rc = await run_teed(argv, log_path, env=preset.env)
        if rc != 0:
            raise EngineError(
                f"llama-perplexity failed (exit {rc}); last lines of {log_path}:\n{log_tail(log_path, lines=30, missing='(no log written)')}"
            )
        text = log_path.read_text(errors="replace")
        if _PPL.search(text):
            break
    return parse_perplexity(text)


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
