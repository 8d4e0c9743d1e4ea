"""A real PyTorch trainer for supervised GPU training runs: a small transformer on synthetic data.

`python -m daedalus.training.gpu_trainer [options]` trains a decoder-only transformer (PyTorch's own layers) on
sequences from a fixed affine recurrence (x[t+1] = a*x[t] + b mod V, a random start each), so the loss really
falls and a resumed run can be seen to continue where it was. It keeps the watchdog's protocol, the same as
the tests' trainer: checkpoints are directories `ckpt-<step>` with `model.pt` and `state.json`, and the marker
`COMPLETE` written last (a half-written one never counts); the checkpoint signal (SIGUSR1) asks for a
checkpoint at the next step boundary; `DAEDALUS_CHECKPOINT_DIR`, `DAEDALUS_CHECKPOINT_EVERY`,
`DAEDALUS_RESUME_FROM` and `DAEDALUS_TARGET_STEPS` (the default of `--steps`) come from the watchdog, and its
steps and tokens go to `DAEDALUS_PROGRESS_FILE` (`{"step": N, "tokens": T}`, at most twice a second), from which
the watchdog reports throughput and the ETA. A checkpoint's `state.json` also holds the model's shape, so that
`daedalus.training.drafter_eval` can rebuild it.

`--leak-mib-per-step` holds that much *host* memory more every step (filled, so it is resident): the
deliberate, configurable leak that the watchdog is there to catch. torch is imported here only; it is no
dependency of Daedalus (the `gpu` extra, or the GPU host's own image).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="python -m daedalus.training.gpu_trainer", description=__doc__.splitlines()[0]
    )
    p.add_argument("--steps", type=int, default=int(env.get("DAEDALUS_TARGET_STEPS") or 0),
                   help="stop after this step (0 = until stopped)")  # fmt: skip
    p.add_argument("--device", default="auto", help="cuda, cpu, or auto (cuda when available)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-step-s", type=float, default=0.0, help="pace steps to at least this long")
    p.add_argument("--checkpoint-dir", type=Path, default=Path(env["DAEDALUS_CHECKPOINT_DIR"])
                   if env.get("DAEDALUS_CHECKPOINT_DIR") else None)  # fmt: skip
    p.add_argument("--every", type=int, default=int(env.get("DAEDALUS_CHECKPOINT_EVERY", "50")))
    p.add_argument("--leak-mib-per-step", type=float, default=0.0, help="host memory held more each step")
    p.add_argument("--max-leak-mib", type=float, default=65536.0, help="a safety cap on the leak")
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args(argv)
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} must divide by --heads {args.heads}")
    if args.every < 1:
        p.error("--every must be >= 1")
    return args


def build_model(args: argparse.Namespace) -> Any:
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.d_model)
            self.pos = nn.Embedding(args.seq, args.d_model)
            layer = nn.TransformerEncoderLayer(args.d_model, args.heads, 4 * args.d_model, dropout=0.0,
                                               batch_first=True, norm_first=True)  # fmt: skip
            self.blocks = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.head = nn.Linear(args.d_model, args.vocab)
            self.register_buffer(
                "mask", nn.Transformer.generate_square_subsequent_mask(args.seq), persistent=False
            )

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            hidden = self.embed(tokens) + self.pos(positions)
            mask: torch.Tensor = self.mask  # type: ignore[assignment]  # a registered buffer
            n = tokens.shape[1]
            hidden = self.blocks(hidden, mask=mask[:n, :n], is_causal=True)
            return self.head(hidden)

    return TinyLM()


def synthetic_batch(args: argparse.Namespace, generator: Any, device: Any) -> Any:
    """Sequences of the recurrence x[t+1] = (5 x[t] + 3) mod V from random starts: learnable, never repeating."""
    import torch

    start = torch.randint(0, args.vocab, (args.batch, 1), generator=generator)
    steps = torch.arange(args.seq + 1).unsqueeze(0)
    # Closed form of the affine recurrence would overflow; iterate in int64 on the CPU (cheap at these sizes).
    seq = torch.empty(args.batch, args.seq + 1, dtype=torch.long)
    seq[:, :1] = start
    for t in range(1, steps.shape[1]):
        seq[:, t] = (5 * seq[:, t - 1] + 3) % args.vocab
    return seq.to(device, non_blocking=True)


MODEL_ARGS = ("d_model", "layers", "heads", "seq", "vocab")
"""What rebuilds the model from a checkpoint (kept in its state.json)."""


def save_checkpoint(
    directory: Path,
    step: int,
    model: Any,
    optimizer: Any,
    loss: float,
    args: argparse.Namespace | None = None,
) -> Path:
    import torch

    path = directory / f"ckpt-{step:07d}"
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "model.pt.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
    os.replace(tmp, path / "model.pt")
    shape = {name: getattr(args, name) for name in MODEL_ARGS} if args is not None else {}
    (path / "state.json").write_text(json.dumps({"step": step, "loss": loss, "model": shape}))
    (path / "COMPLETE").write_text("")  # last: only now does the checkpoint count
    return path


class Progress:
    """Writes the step and token count to `DAEDALUS_PROGRESS_FILE` (whole, by rename), at most every 0.5 s."""

    def __init__(self, path: str | None, every_s: float = 0.5):
        self.path = path
        self.every_s = every_s
        self.last = float("-inf")

    def write(self, step: int, tokens: int, force: bool = False) -> None:
        now = time.monotonic()
        if self.path is None or (not force and now - self.last < self.every_s):
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as handle:
            handle.write(json.dumps({"step": step, "tokens": tokens}))
        os.replace(tmp, self.path)
        self.last = now


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))  # fmt: skip
    torch.manual_seed(args.seed)
    model = build_model(args).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    resume = os.environ.get("DAEDALUS_RESUME_FROM")
    if resume:
        state = torch.load(Path(resume) / "model.pt", map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    params = sum(p.numel() for p in model.parameters())
    print(f"trainer pid={os.getpid()} device={device} params={params} start step={step} resume={resume}",
          flush=True)  # fmt: skip

    checkpoint_requested = False

    def on_checkpoint_signal(signum: int, frame: object) -> None:
        nonlocal checkpoint_requested
        checkpoint_requested = True

    signal.signal(signal.SIGUSR1, on_checkpoint_signal)
    generator = torch.Generator().manual_seed(args.seed + step)
    held: list[bytearray] = []
    carry = 0.0
    tokens_since = 0
    tokens_total = step * args.batch * args.seq
    progress = Progress(os.environ.get("DAEDALUS_PROGRESS_FILE"))
    since = time.monotonic()
    while args.steps == 0 or step < args.steps:
        started = time.monotonic()
        batch = synthetic_batch(args, generator, device)
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        tokens_since += args.batch * args.seq
        tokens_total += args.batch * args.seq
        carry += args.leak_mib_per_step
        if carry >= 1 and sum(len(h) for h in held) < args.max_leak_mib * MIB:
            chunk = int(carry)
            carry -= chunk
            held.append(bytearray(b"\x01") * (chunk * MIB))
        due = step % args.every == 0
        if args.checkpoint_dir is not None and (due or checkpoint_requested):
            path = save_checkpoint(args.checkpoint_dir, step, model, optimizer, float(loss.item()), args)
            print(f"checkpoint step={step} path={path} requested={checkpoint_requested}", flush=True)
            checkpoint_requested = False
        progress.write(step, tokens_total, force=due)
        if step % args.log_every == 0:
            elapsed = time.monotonic() - since
            print(f"step {step} loss {loss.item():.4f} tok/s {tokens_since / elapsed:.0f} "
                  f"leak {sum(len(h) for h in held) // MIB} MiB", flush=True)  # fmt: skip
            tokens_since, since = 0, time.monotonic()
        if args.min_step_s > 0:
            time.sleep(max(0.0, args.min_step_s - (time.monotonic() - started)))
    progress.write(step, tokens_total, force=True)
    print(f"trainer finished at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
