"""Write a tiny random-weight Llama in Hugging Face format: run by the vLLM engine environment's interpreter.

Daedalus's own environment has no torch or transformers, so `daedalus.engines.hf_tiny_model` runs this file
with the engine environment's python (`<env>/bin/python hf_tiny_model_writer.py SPEC_JSON CORPUS OUT_DIR`). It
imports nothing from Daedalus. It trains a byte-level BPE tokenizer on the local corpus with `tokenizers`,
builds a `LlamaForCausalLM` from a config, fills its weights from a seeded generator and saves safetensors.
Nothing is downloaded.

The weights are scaled as the GGUF models' are (daedalus.engines.tiny_model): each matrix's entries have
variance 1/fan-in, so activations stay O(1) and the logits are spread out. Hugging Face's default init (std
0.02) would give nearly uniform logits, where every position is a near tie and temp-0 identity tells nothing.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def train_tokenizer(corpus: Path, vocab_size: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(corpus)], trainer)
    return tokenizer


def write(spec: dict[str, int], corpus: Path, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(spec["seed"])
    raw = train_tokenizer(corpus, spec["vocab_size"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=True
    )
    vocab = raw.get_vocab_size()
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec.get("layers_drawn") or spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        max_position_embeddings=spec["max_position_embeddings"],
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=raw.token_to_id("<s>"),
        eos_token_id=raw.token_to_id("</s>"),
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 1:  # RMSNorm weights
                parameter.fill_(1.0)
            elif name.endswith("embed_tokens.weight"):
                parameter.normal_(0.0, 1.0, generator=generator)
            else:
                std = 1.0 / math.sqrt(parameter.shape[1])
                if name == "lm_head.weight":
                    std *= 4.0  # spread the logits (as the GGUF writer's output matrix)
                parameter.normal_(0.0, std, generator=generator)
    kept = spec["num_hidden_layers"]
    if (
        kept < config.num_hidden_layers
    ):  # a layer-skip drafter: the target's first layers, embeddings and head
        model.model.layers = model.model.layers[:kept]
        model.config.num_hidden_layers = kept
    model = model.to(torch.bfloat16)
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit("usage: hf_tiny_model_writer.py SPEC_JSON CORPUS OUT_DIR")
    spec = json.loads(sys.argv[1])
    write(spec, Path(sys.argv[2]), Path(sys.argv[3]))


if __name__ == "__main__":
    main()
