"""`daedalus engine measure` (and `python -m daedalus.cli.measure`): measure one gate metric with its recipe
(engines/measure.py) and print one `GateMeasurement` JSON on stdout; logs go to stderr."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated

import typer

from daedalus.engines import startup_clock
from daedalus.engines.hf_tiny_model import HF_MODELS, ensure_hf_model
from daedalus.engines.measure import measure
from daedalus.engines.tiny_model import MODELS, ensure_model
from daedalus.errors import EngineError
from daedalus.logs import configure_logging
from daedalus.schemas.engines import Workload
from daedalus.schemas.gates import Metric


def default_workdir(metric: Metric) -> Path:
    """Under the artifact directory (DAEDALUS_ARTIFACTS, or .daedalus/artifacts), never /tmp: a verdict points
    at its raw data, and that data must outlive the measuring process."""
    from daedalus.config import Settings

    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return Settings().artifact_dir / "measurements" / f"{stamp}-{metric.value}-{uuid.uuid4().hex[:8]}"


def main(
    metric: Annotated[Metric, typer.Argument(help="the gate metric")],
    preset: Annotated[str, typer.Option(help="preset name (examples/presets) or YAML path")],
    model: Annotated[
        str,
        typer.Option(
            help="a GGUF file, a tiny model name (tiny, small, medium), or for vLLM a Hugging Face model "
            "directory or id, or tiny-llama (a random-weight Llama written with the vLLM environment)"
        ),
    ],
    baseline_preset: Annotated[
        str | None, typer.Option(help="baseline preset for A/B and relative metrics")
    ] = None,
    users: Annotated[int, typer.Option(min=1)] = 1,
    rounds: Annotated[int, typer.Option(min=1)] = 7,
    max_tokens: Annotated[int, typer.Option(min=2)] = 64,
    prompt_words: Annotated[int, typer.Option(min=1)] = 32,
    position: Annotated[
        int, typer.Option(min=1, help="position_acceptance: the draft position, 1-based")
    ] = 1,
    probes: Annotated[
        int, typer.Option(min=1, help="temp0_identity: probe prompts (the seed's 6d: 60)")
    ] = 60,
    segment: Annotated[
        str,
        typer.Option(help="segment_ms: queue, prefill, decode, inference or e2e (vLLM's request histograms)"),
    ] = "decode",
    workdir: Annotated[
        Path | None, typer.Option(help="artifacts; default under the artifact directory")
    ] = None,
) -> None:
    # stdout carries exactly one JSON object; logs go to stderr (configured again here: an in-process runner
    # calls the command without `daedalus`'s main, which configures them).
    configure_logging()
    # Run as a gate, its engines' start-ups are timed apart from its measuring (engines/startup_clock.py).
    clock = os.environ.get(startup_clock.STARTUP_CLOCK_ENV)
    startup_clock.configure(Path(clock) if clock else None)
    workload = Workload(users=[users], rounds=rounds, max_tokens=max_tokens, prompt_words=prompt_words)
    try:
        model_ref = (
            str(ensure_model(model))
            if model in MODELS
            else str(ensure_hf_model(model))
            if model in HF_MODELS
            else model
        )
        result = asyncio.run(measure(metric, preset, model_ref, baseline_ref=baseline_preset, workload=workload,
                                     workdir=workdir or default_workdir(metric), position=position, probes=probes, segment=segment))  # fmt: skip
    except EngineError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    sys.stdout.write(json.dumps(result.model_dump(mode="json")) + "\n")


app = typer.Typer(add_completion=False, help="Measure one gate metric and print a GateMeasurement JSON.")
app.command()(main)

if __name__ == "__main__":
    from daedalus.config import Settings
    from daedalus.engines import paths

    paths.configure(Settings.load().engines)  # `python -m` is an entry point of its own
    app()
