"""Tiny random-weight Llama models in Hugging Face format, for vLLM, made the way `tiny_model` makes GGUF files.

A model directory holds `config.json`, `model.safetensors` (bfloat16) and a byte-level BPE tokenizer trained
here on local text (the tiny models' words, digits, the probes' sentences); nothing comes from the hub. The
writing needs torch, transformers and tokenizers, which Daedalus's own venv does not have: the vLLM engine
environment's interpreter runs `hf_tiny_model_writer.py`. Directories are cached under the engine cache, keyed
by the spec, the writer and the environment's lock, and appear atomically (written aside, then renamed).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from daedalus.engines.paths import cache_root
from daedalus.engines.tiny_model import _WORDS
from daedalus.engines.vllm_env import VllmEnvironment, installed_environment
from daedalus.errors import EngineSetupError

WRITER = Path(__file__).resolve().parent / "hf_tiny_model_writer.py"


@dataclass(frozen=True)
class HfModelSpec:
    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int = 1024
    """The BPE trainer's ceiling; the tokenizer stops where the corpus has no more merges (~600)."""
    max_position_embeddings: int = 4096
    seed: int = 0
    layers_drawn: int = 0
    """A layer-skip drafter: draw the weights of a model this many layers deep, keep its first
    `num_hidden_layers` (the target's embeddings, first layers and head, bit for bit); 0 keeps every layer."""
    format_version: int = 1  # bump when the corpus or the writer's output changes

    def writer_arguments(self) -> str:
        fields = asdict(self)
        for key in ("name", "format_version"):
            fields.pop(key)
        if not self.layers_drawn:
            fields.pop("layers_drawn")  # a whole model's arguments (and cache key) as before drafters
        return json.dumps(fields, sort_keys=True)


HF_MODELS: dict[str, HfModelSpec] = {
    # The model: 4 layers, 256 wide, head dim 64 (vLLM's CPU attention supports it), GQA 4:2; 5 MB.
    "tiny-llama": HfModelSpec(
        "tiny-llama",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    # The seed's DSpark in miniature: a drafter for tiny-llama made of its first 2 of 4 layers with its
    # embeddings and head, so it proposes what the target's early layers already say (a real, partial acceptance).
    "tiny-llama-draft": HfModelSpec(
        "tiny-llama-draft",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        layers_drawn=4,
    ),
}


def tokenizer_corpus(lines: int = 3000, seed: int = 1) -> str:
    """Local text for the tokenizer: sentences of the tiny models' words, numbers, and the probes' own phrases
    (France, the needles' secret numbers), so every prompt Daedalus sends tokenizes into whole words."""
    rng = random.Random(seed)
    text = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 16))) + " ." for _ in range(lines)]
    text += [f"the secret number is {rng.randint(1000, 9999)} ." for _ in range(200)]
    text += ["The capital of France is Paris .", "what is the secret number ? the secret number is"] * 20
    return "\n".join(text) + "\n"


def _digest(spec: HfModelSpec, env: VllmEnvironment) -> str:
    stamp = env.stamp()
    key = {
        "spec": asdict(spec),
        "writer": hashlib.sha256(WRITER.read_bytes()).hexdigest(),
        "environment": stamp.lock_sha256 if stamp else env.vllm_version(),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def ensure_hf_model(
    name: str = "tiny-llama", *, environment: VllmEnvironment | None = None, directory: Path | None = None
) -> Path:
    """The cached Hugging Face directory of a named tiny model, written with the engine environment if missing."""
    if name not in HF_MODELS:
        raise EngineSetupError(f"unknown tiny Hugging Face model {name!r}; known: {', '.join(HF_MODELS)}")
    spec = HF_MODELS[name]
    env = environment or installed_environment()
    directory = directory or cache_root() / "models"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"daedalus-{spec.name}-{_digest(spec, env)}-hf"
    if (path / "config.json").is_file():
        return path
    scratch = directory / f".{path.name}.{os.getpid()}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    corpus = scratch / "tokenizer_corpus.txt"
    corpus.write_text(tokenizer_corpus())
    done = subprocess.run(
        [str(env.python), str(WRITER), spec.writer_arguments(), str(corpus), str(scratch)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    if done.returncode != 0 or not (scratch / "config.json").is_file():
        shutil.rmtree(scratch, ignore_errors=True)
        raise EngineSetupError(
            f"writing the tiny model {name} with {env.python} failed (exit {done.returncode}):\n"
            + "\n".join((done.stderr or done.stdout).splitlines()[-15:])
        )
    try:
        scratch.rename(path)
    except OSError:  # another process wrote the same model first: keep theirs
        shutil.rmtree(scratch, ignore_errors=True)
    return path
