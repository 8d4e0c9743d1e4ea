"""Whether a gate's prompt can fit its preset's context, decided when the ticket is filed (seed ticket 5: a
48,000-word prompt against a pool capped at 16K tokens would be refused by vLLM on every request, hours later, as
an INVALID gate; it is refused at filing instead, with the reason).

A gate that runs `daedalus engine measure` names its preset and workload on its command line. The preset is read
where the gate will find it, as far as the filing side can see: the engine repo's file at the ticket's base commit
(a local checkout), or a preset shipped with Daedalus or in examples/presets/. Every whitespace-separated word of a
benchmark prompt is at least one token (byte-level BPE and SentencePiece never merge across the space before a
word), so `words + max_tokens` is a lower bound of what one request needs: above the preset's context it cannot
fit, whatever the tokenizer. Below it, it may still not fit (a word is often several tokens); the server then
refuses the request at run time and the measurement is INVALID, with vLLM's reason.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from daedalus.engines.presets import PRESET_DIR, SHIPPED_PRESET_DIR, parse_preset
from daedalus.errors import PresetError
from daedalus.schemas.engines import LlamaCppPreset, VllmPreset, Workload
from daedalus.schemas.ticket import EngineRef, TicketSpec

_DEFAULTS = Workload()


@dataclass(frozen=True)
class MeasureCall:
    """What a gate's `daedalus engine measure` command asks for."""

    metric: str
    presets: tuple[str, ...]
    prompt_words: int
    max_tokens: int


def parse_measure_command(command: str) -> MeasureCall | None:
    """The measure call in a gate command (`daedalus engine measure ...` or `python -m daedalus.engines.measure
    ...`), or None when the command is something else (a test count, a script)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for i, word in enumerate(words[:-1]):
        if (word == "measure" and i > 0 and words[i - 1] == "engine") or word == "daedalus.engines.measure":
            args = words[i + 1 :]
            break
    else:
        return None
    options: dict[str, str] = {}
    for j, arg in enumerate(args):
        if arg.startswith("--") and "=" in arg:
            key, value = arg.split("=", 1)
            options[key] = value
        elif arg.startswith("--") and j + 1 < len(args):
            options[arg] = args[j + 1]
    try:
        prompt_words = int(options.get("--prompt-words", _DEFAULTS.prompt_words))
        max_tokens = int(options.get("--max-tokens", _DEFAULTS.max_tokens))
    except ValueError:
        return None
    presets = tuple(options[f] for f in ("--preset", "--baseline-preset") if f in options)
    return MeasureCall(args[0] if args else "", presets, prompt_words, max_tokens)


def prompt_fit_problems(ticket: TicketSpec) -> list[str]:
    """Each gate of `ticket` whose prompt cannot fit a preset it measures, with what to change."""
    problems = []
    for gate in ticket.gates:
        call = parse_measure_command(gate.command)
        if call is None:
            continue
        needed = call.prompt_words + call.max_tokens
        for ref in call.presets:
            preset = _preset_at_filing(ref, ticket.engine)
            if preset is None:
                continue  # not visible from here: the server's own refusal reports it at run time
            limit, what = _context_of(preset)
            if needed > limit:
                problems.append(
                    f"ticket {ticket.id} gate {gate.name}: its prompt of {call.prompt_words} words is at least "
                    f"{call.prompt_words} tokens, and it asks {call.max_tokens} more: at least {needed} tokens a "
                    f"request, more than preset {preset.name}'s {what} of {limit} (the engine would refuse every "
                    f"request). Lower --prompt-words to at most {max(limit - call.max_tokens, 0)}, or measure on a "
                    "preset whose context holds it"
                )
    return problems


def _context_of(preset: LlamaCppPreset | VllmPreset) -> tuple[int, str]:
    if isinstance(preset, VllmPreset):
        return preset.max_model_len, "max_model_len"
    return preset.context // preset.parallel, f"context per slot ({preset.context} / {preset.parallel} slots)"


def preset_at_filing(ref: str, engine: EngineRef | None) -> LlamaCppPreset | VllmPreset | None:
    """The preset a gate (or the engine's `preset`) will load, as the filing side can see it; else None."""
    return _preset_at_filing(ref, engine)


def _preset_at_filing(ref: str, engine: EngineRef | None) -> LlamaCppPreset | VllmPreset | None:
    """The preset a gate will load, read as the gate will find it, when this side can see it; else None."""
    path = Path(ref)
    in_repo = ref if path.suffix in (".yaml", ".yml") or "/" in ref else f"presets/{ref}.yaml"
    if not path.is_absolute() and engine is not None:
        text = _repo_file(engine, in_repo)
        if text is not None:
            return _parse(text, f"{engine.repo}@{engine.base_commit}:{in_repo}")
    if path.is_absolute():
        return _parse(path.read_text(), str(path)) if path.is_file() else None
    if path.suffix not in (".yaml", ".yml") and "/" not in ref:
        for directory in (SHIPPED_PRESET_DIR, PRESET_DIR):
            candidate = directory / f"{ref}.yaml"
            if candidate.is_file():
                return _parse(candidate.read_text(), str(candidate))
    return None


def _repo_file(engine: EngineRef, relative: str) -> str | None:
    repo = Path(engine.repo).expanduser()
    if not (repo / ".git").exists():
        return None  # a URL, or a checkout on another host
    done = subprocess.run(["git", "show", f"{engine.base_commit}:{relative}"], cwd=repo, capture_output=True,
                          text=True, check=False)  # fmt: skip
    return done.stdout if done.returncode == 0 else None


def _parse(text: str, source: str) -> LlamaCppPreset | VllmPreset | None:
    try:
        return parse_preset(yaml.safe_load(text), source)
    except (yaml.YAMLError, PresetError):
        return None  # an invalid preset is reported by the gate itself, with the field at fault
