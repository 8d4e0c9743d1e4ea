"""Tiny random-weight llama GGUF models, written with the `gguf` package, for tests and `make demo`.

They load in a stock llama.cpp and decode for real; their text is gibberish, their numbers are real.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from daedalus.engines.paths import cache_root

SPACE = "\u2581"  # SentencePiece's word-boundary marker
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "an",
    "be",
    "are",
    "this",
    "which",
    "or",
    "his",
    "her",
    "had",
    "not",
    "but",
    "have",
    "they",
    "one",
    "all",
    "were",
    "their",
    "there",
    "been",
    "has",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "if",
    "out",
    "up",
    "what",
    "about",
    "can",
    "into",
    "than",
    "them",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "like",
    "now",
    "my",
    "such",
    "make",
    "over",
    "our",
    "even",
    "most",
    "me",
    "state",
    "after",
    "also",
    "made",
    "many",
    "did",
    "must",
    "before",
    "back",
    "see",
    "through",
    "way",
    "where",
    "get",
    "much",
    "go",
    "well",
    "your",
    "know",
    "should",
    "down",
    "work",
    "year",
    "because",
    "come",
    "people",
    "just",
    "say",
    "each",
    "those",
    "take",
    "day",
    "good",
    "how",
    "long",
    "secret",
    "number",
    "key",
    "value",
    "needle",
    "answer",
]
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class TinyModelSpec:
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int = 512
    context_length: int = 32768
    seed: int = 0
    format_version: int = 2  # bump when the writer changes, so cached files are rewritten

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


MODELS: dict[str, TinyModelSpec] = {
    # The model: 2 layers, 64 wide, 512-token vocabulary; head dim 32 so q8_0 KV blocks fit.
    "tiny": TinyModelSpec("tiny", n_layer=2, n_embd=64, n_head=2, n_head_kv=2, n_ff=128),
    # Larger ones, so decode throughput is not dominated by per-request overhead.
    "small": TinyModelSpec("small", n_layer=4, n_embd=256, n_head=8, n_head_kv=4, n_ff=768),
    "medium": TinyModelSpec("medium", n_layer=8, n_embd=512, n_head=8, n_head_kv=4, n_ff=1408),
    # The GPU lane's model: ~0.97 B parameters in f16 (1.8 GiB), big enough that decode on an H200 is bound by
    # memory bandwidth rather than launch overhead, as the earlier H200 measurement used.
    "gpu-1b": TinyModelSpec("gpu-1b", n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192),
}


def vocabulary(n_vocab: int) -> list[str]:
    """<unk> <s> </s>, every printable ASCII character, common words, then syllables until full."""
    # <0x0A>: a byte token for newline, which SentencePiece text otherwise cannot encode (llama.cpp aborts).
    pieces = ["<unk>", "<s>", "</s>", "<0x0A>"]
    pieces += [SPACE if c == " " else c for c in map(chr, range(32, 127))]
    pieces += [SPACE + w for w in _WORDS]
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    syllables += [c + v + e for c in _CONSONANTS for v in _VOWELS for e in "nrst"]
    seen = set(pieces)
    for syl in syllables:
        for piece in (SPACE + syl, syl):
            if len(pieces) >= n_vocab:
                return pieces
            if piece not in seen:
                seen.add(piece)
                pieces.append(piece)
    if len(pieces) < n_vocab:
        raise ValueError(f"cannot build a {n_vocab}-token vocabulary from the built-in pieces")
    return pieces


def write_model(spec: TinyModelSpec, path: Path) -> Path:
    """Write `spec` as a GGUF file at `path` (atomically: a temp file renamed into place)."""
    import gguf  # a dev/demo dependency; only needed when a model is written

    rng = np.random.default_rng(spec.seed)
    head_dim = spec.n_embd // spec.n_head
    if head_dim * spec.n_head != spec.n_embd or spec.n_head % spec.n_head_kv:
        raise ValueError(f"model {spec.name}: n_embd must divide by n_head and n_head by n_head_kv")
    pieces = vocabulary(spec.n_vocab)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(f"daedalus-{spec.name}")
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    # Longer pieces score higher so the SentencePiece tokenizer prefers whole words.
    writer.add_token_scores([0.0 if i < 4 else float(len(p)) - i * 1e-4 for i, p in enumerate(pieces)])
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.BYTE]
    writer.add_token_types(types + [gguf.TokenType.NORMAL] * (len(pieces) - len(types)))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    def matrix(rows: int, cols: int) -> np.ndarray:
        # Scaled so activations stay O(1) and logits are spread out (few exact ties at temperature 0).
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    kv = spec.n_head_kv * head_dim
    writer.add_tensor(
        "token_embd.weight", (rng.standard_normal((spec.n_vocab, spec.n_embd))).astype(np.float16)
    )
    for i in range(spec.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm(spec.n_embd))
        writer.add_tensor(f"blk.{i}.attn_q.weight", matrix(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", matrix(kv, spec.n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", matrix(kv, spec.n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", matrix(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm(spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", matrix(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", matrix(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", matrix(spec.n_embd, spec.n_ff))
    writer.add_tensor("output_norm.weight", norm(spec.n_embd))
    writer.add_tensor(
        "output.weight", (matrix(spec.n_vocab, spec.n_embd).astype(np.float32) * 4).astype(np.float16)
    )
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    tmp.rename(path)
    return path


def ensure_model(name: str = "tiny", directory: Path | None = None) -> Path:
    """The cached GGUF for a named tiny model, written if missing."""
    if name not in MODELS:
        raise ValueError(f"unknown tiny model {name!r}; known: {', '.join(MODELS)}")
    spec = MODELS[name]
    directory = directory or cache_root() / "models"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"daedalus-{spec.name}-{spec.digest()}.gguf"
    return path if path.is_file() else write_model(spec, path)


def model_kv_bytes_per_token(name: str, bytes_per_element: float = 2.0) -> float:
    """K and V bytes per token for every layer, from the architecture (the number a measurement must match)."""
    spec = MODELS[name]
    head_dim = spec.n_embd // spec.n_head
    return 2 * spec.n_layer * spec.n_head_kv * head_dim * bytes_per_element
