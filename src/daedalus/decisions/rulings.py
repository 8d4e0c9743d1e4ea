"""Standing rulings: a decision that becomes a rule the policy enforces on every later ticket and campaign.

The seed's Wayne rules "KV quantization is always TBQ; fp16 only as a baseline". Here that is a `Rule`, small
and typed: it `forbid`s or `require`s values of one field of one engine's presets, e.g.

    effect: require
    engine: vllm
    field: kv_cache_dtype
    values: [tq_4bit_nc, tq_3bit_nc, tq_k3v4_nc]
    baselines_exempt: true          # "fp16 only as a baseline"

or "forbid preset X" (`field: name, values: [X]`). A rule is checked where it enters (the field must be a plain
field of that engine's preset, each value a value that field can take), so a ruling that could never match is
refused with the reason, not recorded. A `Ruling` is the rule as decided: which question made it, who ruled and
when. Rulings are made by answering a question (daedalus.decisions.questions) with the option that enacts its
rule; the answer's audit event (`ruled`) is the ruling's record, so the store's audit trail is their one source.

Pure functions, no I/O: filing (services) and campaigns ask `preset_breaks` with the presets they can see.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, model_validator

from daedalus.schemas._base import Model, SpecModel
from daedalus.schemas.engines import (
    LLAMA_CACHE_TYPES,
    VLLM_KV_DTYPES,
    EngineKind,
    LlamaCppPreset,
    VllmPreset,
)
from daedalus.schemas.limits import LIST_ITEMS, Line

RuleValue = str | int | float | bool
PRESET_MODELS: dict[EngineKind, type[BaseModel]] = {
    EngineKind.LLAMA_CPP: LlamaCppPreset,
    EngineKind.VLLM: VllmPreset,
}
KNOWN_VALUES: dict[tuple[EngineKind, str], tuple[str, ...]] = {
    (EngineKind.VLLM, "kv_cache_dtype"): VLLM_KV_DTYPES,
    (EngineKind.LLAMA_CPP, "cache_type_k"): LLAMA_CACHE_TYPES,
    (EngineKind.LLAMA_CPP, "cache_type_v"): LLAMA_CACHE_TYPES,
}
"""Fields whose values the preset checks against a list: a rule's values are checked against the same list."""
_SCALARS = (str, int, float, bool)


class RuleEffect(StrEnum):
    FORBID = "forbid"
    """No preset of the engine may have the field at any of `values`."""
    REQUIRE = "require"
    """Every preset of the engine must have the field at one of `values`."""


def rule_fields(engine: EngineKind) -> list[str]:
    """The fields a rule may name for `engine`'s presets: the plain (scalar or optional scalar) ones."""
    model = PRESET_MODELS[engine]
    return sorted(
        name for name, info in model.model_fields.items() if name != "engine" and _scalar(info.annotation)
    )


def _scalar(annotation: Any) -> bool:
    if annotation in _SCALARS or _is_enum(annotation):
        return True
    origin = get_origin(annotation)
    if origin is Literal:
        return True
    if origin in (Union, UnionType):  # int | None, Literal[...] | None
        return all(_scalar(a) for a in get_args(annotation) if a is not type(None))
    return False


def _is_enum(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, StrEnum)


class Rule(SpecModel):
    """Forbid or require values of one field of one engine's presets."""

    effect: RuleEffect
    engine: EngineKind = Field(description="whose presets: `vllm` or `llama.cpp` (a field belongs to one)")
    field: str = Field(min_length=1, max_length=64, description="a preset field, e.g. kv_cache_dtype, name")
    values: list[RuleValue] = Field(min_length=1, max_length=LIST_ITEMS)
    baselines_exempt: bool = Field(
        default=False,
        description="a preset used only as an A/B gate's baseline is not held to the rule ('fp16 only as a "
        "baseline')",
    )

    @model_validator(mode="after")
    def _field_and_values(self) -> Rule:
        fields = rule_fields(self.engine)
        if self.field not in fields:
            raise ValueError(
                f"field {self.field!r} is not a plain field of a {self.engine.value} preset; choose one of "
                f"{', '.join(fields)}"
            )
        annotation: Any = PRESET_MODELS[self.engine].model_fields[self.field].annotation
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        checked: list[RuleValue] = []
        for value in self.values:
            try:
                parsed = adapter.validate_python(value)
            except ValidationError as error:
                problem = error.errors()[0]["msg"]
                raise ValueError(
                    f"value {value!r} cannot be a {self.engine.value} preset's {self.field}: {problem}"
                ) from None
            known = KNOWN_VALUES.get((self.engine, self.field))
            if known is not None and parsed not in known:
                raise ValueError(
                    f"value {value!r} is not a {self.engine.value} {self.field}; known: {', '.join(known)}"
                )
            checked.append(parsed.value if isinstance(parsed, StrEnum) else parsed)
        repeated = sorted({str(v) for v in checked if checked.count(v) > 1})
        if repeated:
            raise ValueError(f"values are repeated: {repeated}")
        object.__setattr__(self, "values", checked)
        return self

    def describe(self) -> str:
        shown = ", ".join(str(v) for v in self.values)
        what = "must be one of" if self.effect is RuleEffect.REQUIRE else "must not be"
        exempt = " (a baseline is exempt)" if self.baselines_exempt else ""
        return f"a {self.engine.value} preset's {self.field} {what} [{shown}]{exempt}"

    def broken_by(self, preset: LlamaCppPreset | VllmPreset, *, baseline: bool = False) -> str | None:
        """What `preset` does against this rule, or None when it obeys (or the rule is not about it)."""
        if preset.engine != self.engine.value or (baseline and self.baselines_exempt):
            return None
        value = getattr(preset, self.field)
        value = value.value if isinstance(value, StrEnum) else value
        inside = value in self.values
        if self.effect is RuleEffect.FORBID and inside:
            return f"preset {preset.name} has {self.field} {value!r}"
        if self.effect is RuleEffect.REQUIRE and not inside:
            return f"preset {preset.name} has {self.field} {value!r}"
        return None


class Ruling(Model):
    """A rule as decided: the question that made it, who ruled and when. Standing until the store says otherwise."""

    id: str = Field(description="the question that made it (its id)")
    statement: Line = Field(description="the ruling in words, e.g. 'KV quantization is always TBQ'")
    rule: Rule | None = Field(default=None, description="None: the ruling only lifts earlier ones")
    revokes: list[str] = Field(default_factory=list, description="earlier rulings this one lifts")
    ruled_by: str
    ruled_at: datetime
    note: str = ""

    def label(self) -> str:
        return f"ruling {self.id} ({self.statement!r}, {self.ruled_by}, {self.ruled_at:%Y-%m-%d %H:%M} UTC)"

    def broken_by(self, preset: LlamaCppPreset | VllmPreset, *, baseline: bool = False) -> str | None:
        """The refusal naming this ruling, or None when `preset` obeys it."""
        if self.rule is None:
            return None
        what = self.rule.broken_by(preset, baseline=baseline)
        if what is None:
            return None
        return f"{what}, which {self.label()} forbids: {self.rule.describe()}"


def standing(rulings: list[Ruling]) -> list[Ruling]:
    """Of every ruling made (oldest first), those that stand: with a rule, and not lifted by a later one."""
    lifted = {revoked for ruling in rulings for revoked in ruling.revokes}
    return [ruling for ruling in rulings if ruling.rule is not None and ruling.id not in lifted]


def describe(ruling: Ruling) -> str:
    """What the ruling does, in one line."""
    parts = [ruling.rule.describe()] if ruling.rule is not None else []
    if ruling.revokes:
        parts.append(f"lifts {', '.join(ruling.revokes)}")
    return "; ".join(parts)


def preset_breaks(
    rulings: list[Ruling], preset: LlamaCppPreset | VllmPreset, *, baseline: bool = False
) -> list[str]:
    """Every standing ruling `preset` breaks, each as a sentence naming the ruling."""
    return [why for ruling in rulings if (why := ruling.broken_by(preset, baseline=baseline)) is not None]
