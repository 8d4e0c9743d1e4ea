"""The llama.cpp adapter: llama-server launched with a preset, its KV cache read from the start-up log."""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from daedalus.engines.base import EngineAdapter
from daedalus.engines.llama_build import LlamaBuild
from daedalus.errors import EngineError
from daedalus.schemas.engines import LlamaCppPreset

# llama_kv_cache: size =   16.00 MiB (  2048 cells,   2 layers,  1/1 seqs), K (f16):    8.00 MiB, V (f16): ...
_KV_LINE = re.compile(
    r"llama_kv_cache(?:_unified)?: size =\s*(?P<mib>[\d.]+) MiB \(\s*(?P<cells>\d+) cells,\s*(?P<layers>\d+) layers"
    r".*?K \((?P<ktype>\w+)\):\s*(?P<kmib>[\d.]+) MiB, V \((?P<vtype>\w+)\):\s*(?P<vmib>[\d.]+) MiB"
)
_ALLOWED = re.compile(r"allowed values:\s*([\w, ]+)")


@dataclass(frozen=True)
class LlamaKvCache:
    """One KV cache as llama.cpp reported it at start-up (the draft model's is a second one)."""

    mib: float
    cells: int
    layers: int
    k_type: str
    v_type: str


def parse_kv_cache_log(text: str) -> list[LlamaKvCache]:
    """Every `llama_kv_cache: size = ...` line, target model first."""
    return [
        LlamaKvCache(float(m["mib"]), int(m["cells"]), int(m["layers"]), m["ktype"], m["vtype"])
        for m in _KV_LINE.finditer(text)
    ]


@functools.cache
def supported_cache_types(server: Path) -> tuple[str, ...]:
    """The KV cache types this llama-server build accepts, from its own --help."""
    out = subprocess.run([str(server), "--help"], capture_output=True, text=True, timeout=30, check=False)
    for line_no, line in enumerate(out.stdout.splitlines()):
        if "--cache-type-k" in line:
            block = "\n".join(out.stdout.splitlines()[line_no : line_no + 4])
            m = _ALLOWED.search(block)
            if m:
                return tuple(t.strip() for t in m.group(1).split(",") if t.strip())
    return ()


class LlamaCppAdapter(EngineAdapter):
    preset: LlamaCppPreset

    def __init__(self, build: LlamaBuild, preset: LlamaCppPreset) -> None:
        self.build = build
        self.preset = preset

    def command(self, model: Path, port: int) -> list[str]:
        p = self.preset
        argv = [
            str(self.build.binary("llama-server")),
            "--model", str(model),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--ctx-size", str(p.context),
            "--parallel", str(p.parallel),
            "--cache-type-k", p.cache_type_k,
            "--cache-type-v", p.cache_type_v,
            "--flash-attn", p.flash_attn,
            "--n-gpu-layers", str(p.n_gpu_layers),
            "--metrics",
            "--no-webui",
            # Level 4 keeps llama.cpp's own info lines (the KV cache size the capacity reader needs).
            "--log-verbosity", "4",
        ]  # fmt: skip
        if p.threads is not None:
            argv += ["--threads", str(p.threads)]
        if p.batch_size is not None:
            argv += ["--batch-size", str(p.batch_size)]
        if p.ubatch_size is not None:
            argv += ["--ubatch-size", str(p.ubatch_size)]
        if p.draft is not None and p.draft.method == "ngram-simple":
            argv += [
                "--spec-type", "ngram-simple",
                "--spec-ngram-simple-size-n", str(p.draft.ngram_size),
                "--spec-ngram-simple-size-m", str(p.draft.draft_max),
            ]  # fmt: skip
        elif p.draft is not None:
            draft_model = model if p.draft.model == "self" else Path(p.draft.model)
            # Without an explicit type this llama.cpp loads the draft model but never drafts.
            argv += [
                "--spec-type", "draft-simple",
                "--spec-draft-model", str(draft_model),
                "--spec-draft-n-max", str(p.draft.draft_max),
                "--spec-draft-n-min", str(p.draft.draft_min),
                "--spec-draft-p-min", str(p.draft.p_min),
            ]  # fmt: skip
        return argv + list(p.extra_args)

    def environment(self) -> Mapping[str, str]:
        return self.preset.env

    def request_extras(self) -> dict[str, object]:
        # llama.cpp reuses a common prompt prefix (even the BOS token) unless told not to; a measurement must not.
        return {"cache_prompt": False}

    def validate(self, model: Path, port: int) -> None:
        super().validate(model, port)
        p = self.preset
        if p.draft is not None and p.draft.model != "self" and not Path(p.draft.model).is_file():
            raise EngineError(f"preset {p.name}: draft.model {p.draft.model} does not exist")
        known = supported_cache_types(self.build.binary("llama-server"))
        for field in ("cache_type_k", "cache_type_v"):
            value = getattr(p, field)
            if known and value not in known:
                raise EngineError(
                    f"preset {p.name} sets {field} {value!r}, which this llama.cpp build "
                    f"({self.build.source_hash}) does not know; known: {', '.join(known)}. "
                    "Turbo types need the turbo fork's source tree."
                )
