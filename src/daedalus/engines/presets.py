"""Named engine presets: YAML files validated into `LlamaCppPreset` or `VllmPreset`."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from daedalus.engines.paths import REPO_ROOT
from daedalus.errors import PresetError
from daedalus.schemas.engines import LlamaCppPreset, Preset, VllmPreset

PRESET_DIR = REPO_ROOT / "examples" / "presets"
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
    candidate = PRESET_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        known = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))) or "(none)"
        raise PresetError(f"no preset named {name_or_path!r} in {PRESET_DIR}; known: {known}")
    return candidate


def load_preset(name_or_path: str | Path) -> LlamaCppPreset | VllmPreset:
    path = resolve_preset_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PresetError(f"{path}: not valid YAML: {exc}") from None
    return parse_preset(data, str(path))
