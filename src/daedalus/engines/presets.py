"""Named engine presets: YAML files validated into `LlamaCppPreset` or `VllmPreset`.

A bare name is looked up, in order, in the engine repo's `presets/` (a gate's command runs in the attempt's
worktree, so that is the working directory), in the presets shipped inside the installed package
(`daedalus/engines/shipped_presets/`, in the wheel too), and in the source checkout's `examples/presets/`.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from daedalus.errors import PresetError
from daedalus.paths import REPO_ROOT
from daedalus.schemas.engines import LlamaCppPreset, Preset, VllmPreset

PRESET_DIR = REPO_ROOT / "examples" / "presets"
SHIPPED_PRESET_DIR = Path(__file__).resolve().parent / "shipped_presets"
ENGINE_REPO_PRESETS = Path("presets")
"""Relative to the working directory: the engine repo a gate's command runs in."""
_ADAPTER: TypeAdapter[LlamaCppPreset | VllmPreset] = TypeAdapter(Preset)


def parse_preset(data: object, source: str = "<preset>") -> LlamaCppPreset | VllmPreset:
    """Validate a preset mapping; errors name the field, the bad value and what is allowed."""
    if not isinstance(data, dict):
        raise PresetError(f"{source}: a preset must be a mapping of fields, got {type(data).__name__}")
    if "engine" not in data:
        raise PresetError(f"{source}: field 'engine' is required; set it to 'llama.cpp' or 'vllm'")
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            # Drop the discriminator's tag from the location so the field reads as written in the YAML.
            loc = ".".join(str(p) for p in err["loc"] if p not in ("llama.cpp", "vllm"))
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown field '{loc}' (check the spelling; see examples/presets/)")
            else:
                value = err.get("input")
                problems.append(f"field '{loc}': {err['msg']} (got {value!r})")
        raise PresetError(f"{source}: invalid preset:\n  " + "\n  ".join(problems)) from None


def resolve_preset_path(name_or_path: str | Path) -> Path:
    """A path to a YAML file, or a bare name looked up in examples/presets/."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise PresetError(f"preset file {path} does not exist")
        return path
    directories = preset_directories()
    for directory in directories:
        candidate = directory / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted({p.stem for d in directories for p in d.glob("*.yaml")})) or "(none)"
    where = ", ".join(str(d) for d in directories)
    raise PresetError(f"no preset named {name_or_path!r} in {where}; known: {known}")


def preset_directories() -> list[Path]:
    """Where bare preset names are looked up, first match wins: the engine repo's presets/, the package's
    shipped presets, the source checkout's examples/presets/ (absent from an installed wheel)."""
    found: list[Path] = []
    for directory in (ENGINE_REPO_PRESETS.resolve(), SHIPPED_PRESET_DIR, PRESET_DIR):
        if directory.is_dir() and directory not in found:
            found.append(directory)
    return found


def load_preset(name_or_path: str | Path) -> LlamaCppPreset | VllmPreset:
    path = resolve_preset_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PresetError(f"{path}: not valid YAML: {exc}") from None
    return parse_preset(data, str(path))
