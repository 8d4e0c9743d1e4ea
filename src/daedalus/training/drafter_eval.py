"""A drafter checkpoint's acceptance length against n-gram drafting: the CPU stand-in for train8's evaluation.

`python -m daedalus.training.drafter_eval [--checkpoint DIR]` (default `$DAEDALUS_CHECKPOINT`) rebuilds the small
transformer `daedalus.training.gpu_trainer` trained (its shape is in the checkpoint's state.json), and decodes
speculatively with it as the drafter: each step it drafts `--k` tokens greedily, the target accepts the longest
prefix that matches its own tokens and adds one of its own, as speculative decoding does. The target is exact
here: the recurrence the trainer's data follows (x[t+1] = 5 x[t] + 3 mod V), so its tokens are known without a
second model. The acceptance length is tokens per target step (1 + accepted drafts). The baseline drafts the
same way from the sequence itself (prompt lookup, as vLLM's `ngram` method: the latest earlier occurrence of the
last n tokens, n from `--ngram-max` down to `--ngram-min`), on the same prompts.

Each round decodes `--prompts` fresh prompts (new random starts) and gives one paired sample: the drafter's and
the baseline's acceptance length over the round. It prints one `GateMeasurement` line: an A/B gate on it judges
the drafter against the baseline (MEASUREMENT.md). On a GPU host the same hook runs the team's own evaluation
against the served target; this module measures only what a CPU can: the drafter against an exact target.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from daedalus.training.gpu_trainer import MODEL_ARGS, build_model

A, B = 5, 3
"""The recurrence of the trainer's synthetic data (gpu_trainer.synthetic_batch)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m daedalus.training.drafter_eval", description=__doc__.splitlines()[0]
    )
    default = os.environ.get("DAEDALUS_CHECKPOINT")
    p.add_argument("--checkpoint", type=Path, default=Path(default) if default else None)
    p.add_argument("--k", type=int, default=4, help="tokens drafted per target step")
    p.add_argument("--rounds", type=int, default=7, help="paired samples (7: MEASUREMENT.md's default)")
    p.add_argument("--prompts", type=int, default=4, help="prompts decoded per round")
    p.add_argument("--context", type=int, default=8, help="prompt tokens")
    p.add_argument("--tokens", type=int, default=64, help="tokens decoded per prompt")
    p.add_argument("--ngram-max", type=int, default=3)
    p.add_argument("--ngram-min", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if args.checkpoint is None:
        p.error("no checkpoint: pass --checkpoint or set DAEDALUS_CHECKPOINT")
    return args


def load_drafter(checkpoint: Path) -> tuple[Any, argparse.Namespace, int | None]:
    import torch

    state = json.loads((checkpoint / "state.json").read_text())
    shape = state.get("model") or {}
    missing = [name for name in MODEL_ARGS if name not in shape]
    if missing:
        raise SystemExit(
            f"{checkpoint}/state.json has no model shape ({', '.join(missing)}): not a gpu_trainer checkpoint"
        )
    args = argparse.Namespace(**shape)
    model = build_model(args)
    weights = torch.load(checkpoint / "model.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(weights["model"])
    model.eval()
    return model, args, state.get("step")


def target_next(token: int, vocab: int) -> int:
    return (A * token + B) % vocab


def drafter_proposal(model: Any, sequence: list[int], k: int, window: int) -> list[int]:
    """k tokens drafted greedily by the model, each fed back in (the last `window` tokens are its context)."""
    import torch

    drafted: list[int] = []
    context = list(sequence)
    for _ in range(k):
        tokens = torch.tensor([context[-window:]], dtype=torch.long)
        token = int(model(tokens)[0, -1].argmax())
        drafted.append(token)
        context.append(token)
    return drafted


def ngram_proposal(sequence: list[int], k: int, longest: int, shortest: int) -> list[int]:
    """Prompt lookup: after the latest earlier occurrence of the last n tokens, the k tokens that followed."""
    for n in range(longest, shortest - 1, -1):
        if len(sequence) <= n:
            continue
        suffix = sequence[-n:]
        for start in range(len(sequence) - n - 1, -1, -1):
            if sequence[start : start + n] == suffix:
                return sequence[start + n : start + n + k]
    return []


def decode(prompt: list[int], total: int, vocab: int, propose: Any) -> tuple[int, int]:
    """(tokens decoded, target steps) of speculative decoding with `propose(sequence)` as the drafter."""
    sequence = list(prompt)
    produced = steps = 0
    while produced < total:
        drafted = propose(sequence)
        accepted = 0
        expected = sequence[-1]
        for token in drafted:
            expected = target_next(expected, vocab)
            if token != expected:
                break
            accepted += 1
        truth = sequence[-1]
        for _ in range(accepted + 1):  # the accepted drafts, then the target's own token
            truth = target_next(truth, vocab)
            sequence.append(truth)
        produced += accepted + 1
        steps += 1
    return produced, steps


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    model, shape, step = load_drafter(args.checkpoint)
    samples: list[float] = []
    baseline: list[float] = []
    with torch.inference_mode():
        for round_index in range(args.rounds):
            generator = torch.Generator().manual_seed(args.seed + round_index)
            starts = torch.randint(0, shape.vocab, (args.prompts,), generator=generator).tolist()
            ours, theirs = [0, 0], [0, 0]
            for start in starts:
                prompt = [int(start)]
                while len(prompt) < args.context:
                    prompt.append(target_next(prompt[-1], shape.vocab))
                for totals, propose in (
                    (ours, lambda seq: drafter_proposal(model, seq, args.k, shape.seq)),
                    (theirs, lambda seq: ngram_proposal(seq, args.k, args.ngram_max, args.ngram_min)),
                ):
                    produced, steps = decode(prompt, args.tokens, shape.vocab, propose)
                    totals[0] += produced
                    totals[1] += steps
            samples.append(round(ours[0] / ours[1], 4))
            baseline.append(round(theirs[0] / theirs[1], 4))
            print(
                f"round {round_index + 1}: drafter {samples[-1]} n-gram {baseline[-1]}",
                file=sys.stderr,
                flush=True,
            )
    measurement = {
        "samples": samples,
        "baseline_samples": baseline,
        "unit": "tokens/step",
        "method": (
            f"acceptance length (tokens per target step) of the checkpoint as drafter, k={args.k}, greedy, against "
            f"n-gram prompt lookup (n={args.ngram_max}..{args.ngram_min}); exact target (the training data's "
            f"recurrence); {args.prompts} fresh prompts of {args.context} tokens, {args.tokens} tokens each, per round"
        ),
        "evidence": {"checkpoint": str(args.checkpoint), "checkpoint_step": str(step)},
    }
    print(json.dumps(measurement), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
