"""Read a campaign spec (YAML or JSON); every problem is reported with its field path."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from daedalus.schemas.campaigns import CampaignSpec


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
        return CampaignSpec.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in error.errors())
        raise CampaignSpecError(f"{path}: invalid campaign: {problems}") from None
