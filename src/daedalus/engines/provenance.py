"""What a measurement measured: the engine build, preset, model, workload and where the raw data is kept."""

from __future__ import annotations

import hashlib
import json
import re
import socket
from pathlib import Path

from daedalus.engines.llama_build import LlamaBuild
from daedalus.engines.presets import resolve_preset_path
from daedalus.engines.vllm import VllmAdapter
from daedalus.errors import EngineError
from daedalus.schemas.engines import LlamaCppPreset, VllmPreset, Workload
from daedalus.schemas.gates import Provenance

# A Hugging Face id: "org/name", no leading "/" or ".", nothing that looks like a path deeper than that.
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_EDGE = 16 * 1024 * 1024


def resolve_model(model: str, presets: list[LlamaCppPreset | VllmPreset]) -> Path:
    """The model argument as the presets' engines accept it; a clear error otherwise.

    llama.cpp takes a GGUF file. vLLM takes a Hugging Face model directory (with config.json), or a Hugging Face
    id that the GPU host resolves from its own cache.
    """
    path = Path(model).expanduser()
    needs_file = [p.name for p in presets if isinstance(p, LlamaCppPreset)]
    if needs_file:
        if not path.is_file():
            raise EngineError(
                f"model file {path} does not exist (presets {', '.join(needs_file)} are llama.cpp: they need a "
                "GGUF file; write a tiny one with `daedalus engine model`)"
            )
        return path.resolve()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise EngineError(
                f"{path} is a directory without config.json: not a Hugging Face model directory"
            )
        return path.resolve()
    if path.is_file():
        return path.resolve()
    if _HF_ID.match(model) and not model.startswith("."):
        return Path(model)
    raise EngineError(
        f"model {model!r} is neither a file, a Hugging Face model directory (with config.json), nor a Hugging "
        "Face id like 'Qwen/Qwen3-30B-A3B'"
    )


def model_hash(model: Path) -> tuple[str | None, str]:
    """A content hash of the model and how it was taken (a full hash of a 50 GB checkpoint would take minutes).

    A file: sha256 of its size, first and last 16 MiB. A directory: sha256 of each file's name and size and of
    its small files' contents (config, tokenizer, index). A hub id: no hash; the host's cache decides.
    """
    if model.is_file():
        digest = hashlib.sha256(str(model.stat().st_size).encode())
        with model.open("rb") as f:
            digest.update(f.read(_EDGE))
            if model.stat().st_size > 2 * _EDGE:
                f.seek(-_EDGE, 2)
                digest.update(f.read(_EDGE))
        return digest.hexdigest(), "sha256(size, first and last 16 MiB)"
    if model.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in model.rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(model)}:{file.stat().st_size}\n".encode())
            if file.stat().st_size <= 1024 * 1024:
                digest.update(file.read_bytes())
        return digest.hexdigest(), "sha256(names, sizes, files <= 1 MiB)"
    return None, "Hugging Face id: resolved by the host's cache, not hashed"


def engine_build(
    preset: LlamaCppPreset | VllmPreset, build: LlamaBuild | None, model: Path | None = None
) -> tuple[str, str, list[str]]:
    """(engine, build identity, flags) of the engine that serves `preset`. vLLM: the version installed in the
    environment that serves it (read from its metadata, not from Daedalus's venv) and the server's full argv
    (the port, chosen at launch, shown as <port>)."""
    if isinstance(preset, LlamaCppPreset):
        if build is None:
            raise EngineError(f"preset {preset.name} needs a llama.cpp build")
        marker = build.build_dir.parent / "build.json"
        flags = json.loads(marker.read_text()).get("flags", []) if marker.is_file() else []
        return "llama.cpp", build.source_hash, [str(f) for f in flags]
    adapter = VllmAdapter(preset)
    argv = adapter.command(model or Path("<model>"), 0)
    argv[argv.index("--port") + 1] = "<port>"
    return "vllm", adapter.engine_identity(), argv


def provenance(
    preset_ref: str,
    preset: LlamaCppPreset | VllmPreset,
    model: Path,
    *,
    build: LlamaBuild | None,
    artifacts: Path,
    baseline: LlamaCppPreset | VllmPreset | None = None,
    workload: Workload | None = None,
    extra: dict[str, str] | None = None,
) -> Provenance:
    engine, identity, flags = engine_build(preset, build, model)
    preset_path = resolve_preset_path(preset_ref)
    sha, method = model_hash(model)
    shape = {k: json.dumps(v) for k, v in workload.model_dump(mode="json").items()} if workload else {}
    return Provenance(
        engine=engine,
        engine_build=identity,
        engine_flags=flags,
        preset=preset.name,
        preset_sha256=hashlib.sha256(preset_path.read_bytes()).hexdigest(),
        baseline_preset=baseline.name if baseline else None,
        model=str(model),
        model_sha256=sha,
        model_hash_method=method,
        workload={**shape, **(extra or {})},
        host=socket.gethostname(),
        artifacts=str(artifacts),
    )
