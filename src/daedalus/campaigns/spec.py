"""Read a campaign spec (YAML or JSON); every problem is reported with its field path."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from daedalus.errors import PresetError
from daedalus.schemas.campaigns import BASE_KV, CampaignSpec
from daedalus.schemas.engines import LlamaCppPreset, turbo_trap


class CampaignSpecError(ValueError):
    """A campaign file that cannot be read or does not validate; the message says where and why."""


def load_campaign(path: Path) -> CampaignSpec:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise CampaignSpecError(f"cannot read {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise CampaignSpecError(f"{path} is not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise CampaignSpecError(f"{path}: a campaign is a mapping of fields (id, host, axes, ...)")
    try:
        spec = CampaignSpec.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in error.errors())
        raise CampaignSpecError(f"{path}: invalid campaign: {problems}") from None
    problem = turbo_problem(spec)
    if problem:
        raise CampaignSpecError(f"{path}: invalid campaign: {problem}")
    return spec


def turbo_problem(spec: CampaignSpec) -> str:
    """Why a turbo KV cell of this campaign would fall into the turbo fork's auto-asymmetric trap ('' if none):
    checked when the campaign is filed, with its base presets' env and its own, not when a cell runs on the host."""
    from daedalus.engines.presets import load_preset

    for name in spec.axes.preset or [spec.base_preset]:
        try:
            base = load_preset(name)
        except PresetError:
            continue  # a preset only the host has: its cells say what is wrong there
        if not isinstance(base, LlamaCppPreset):
            continue
        env = {**base.env, **spec.env}
        for kv in spec.axes.kv:
            k, v = (base.cache_type_k, base.cache_type_v) if kv == BASE_KV else (kv, kv)
            trap = turbo_trap(k, v, env)
            if trap is not None:
                return f"axes.kv {kv!r} on base preset {name!r}: {trap} (a campaign sets it for every cell with env)"
    return ""
