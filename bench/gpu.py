"""Daedalus on a GPU host, end to end: the offline bundle, a CUDA build, a GPU ticket and a GPU training run.

Three commands; the last two run on the GPU host (the lent H200 takes 64 MiB a call, so the bundle travels in
two halves; $HOME survives between calls while the machine stays warm):

    .venv/bin/python bench/gpu.py pack     # here: .gpu/bundle (--python 3.12 --skip h200) and .gpu/llama.cpp.tar.xz
    python3 bench/gpu.py stage             # there, call 1: carry .gpu/bundle/{wheels,debs,manifest.json,install.sh}
                                           #   and .gpu/llama.cpp.tar.xz; install, unpack, CUDA build, model
    python3 bench/gpu.py run               # there, call 2, at once: carry .gpu/bundle/{temporal.xz,manifest.json}

`stage` and `run` start under the host's bare python3: the first phase uses the standard library only
(`daedalus.hosts.bundle_install`), copies what was carried into the work directory ($HOME/tmp/daedalus-gpu),
installs the bundle there with no index (or completes the install made by an earlier call), then re-runs this
script under the installed venv, which builds the settings once and hands the engine section to the engine
code (DAEDALUS_CACHE_DIR, under the work directory, holds the llama.cpp source, builds and models).

`stage`, in the venv: records nvidia-smi -q -x, its compute capabilities, NVML's answers and the image's pip
list (fixtures for the CPU tests), builds llama.cpp with CUDA for the GPUs' architectures (cached by source hash
and flags), writes the 1B test model, and checks the host (`daedalus host check`, not sent: nothing runs yet).

`run`, in the venv:
1. harness fidelity on the GPU: 7 rounds x 128 tokens on the 1B f16 model (gpu-f16 preset), client decode tok/s
   against llama-server's own timings, `llama-bench` tg128; the device copy bandwidth and the bandwidth floor;
2. the embedded stack (dev server from the bundle's temporal binary, SQLite store) with a worker for host
   `h200`, declared with its GPUs in a hosts.yaml of the work directory; the host's check, kept by its lease
   keeper; a ticket modelled on ticket 4: the scripted agent (in the bundle's bubblewrap where the host has
   none) switches the serving preset from f16 KV without flash attention to q8_0 KV with it; the ticket builds
   with CUDA and decides four gates on the GPU, each confined to a sandbox that sees only the leased GPU;
3. a GPU training run (a deliberate host-memory leak) on h200 under the watchdog: three graceful stops and one
   hunting ticket;
4. writes bench/results/gpu.json and copies it, the store, the report, the audit trail, the check and the GPU
   recordings to --out ($OUT by default).

    python3 bench/gpu.py campaign          # there, call 3, at once: carry .gpu/bundle/{temporal.xz,manifest.json}

`campaign`, in the venv: examples/campaigns/h200-engine-settings.yaml on the embedded stack (KV type x flash
attention x (batch, micro-batch) x threads, each cell under a lease on the GPU, decode tok/s and its fraction of
the bandwidth floor with their intervals, KiB/token from NVML, the needle), until it proposes a preset; writes
bench/results/gpu-campaign.json (the cells, the proposal, the default preset's cell beside it) and the report's
campaign section to --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "bench" / "results" / "gpu.json"
GPU_DIR = REPO / ".gpu"
HOST = "h200"
MODEL = "gpu-1b"
N_GEN = 128
LLAMA_CPP_PYTHON = "0.3.36"
# What a CMake build of llama-server, llama-perplexity and llama-bench reads (tests, examples, docs and models are not
# built; scripts/ holds the UI-assets step, which runs even with the UI off): 7 MiB as xz, not 176 MiB.
SOURCE_PARTS = ("CMakeLists.txt", "CMakePresets.json", "LICENSE", "cmake", "common", "ggml", "src", "include",
                "tools", "vendor", "licenses", "app", "scripts")  # fmt: skip


def log(message: str) -> None:
    print(f"[gpu-bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- here: pack what the GPU host needs ------------------------------------------------------------------------


def pack(args: argparse.Namespace) -> None:
    """The bundle and the trimmed llama.cpp source under .gpu/, and the two device calls that use them."""
    from daedalus.cli._common import settings
    from daedalus.hosts.bundle import BundleTarget, build_bundle

    source = settings().engines.llama_source
    if not (source / "CMakeLists.txt").is_file():
        raise SystemExit(f"no llama.cpp source at {source}: run scripts/fetch_llama_cpp.sh first")
    bundle = args.bundle
    if bundle.exists():
        shutil.rmtree(bundle)
    manifest = build_bundle(bundle, target=BundleTarget(python="3.12"), skip=["h200"], progress=log)
    log(f"bundle {bundle}: {int(manifest['total_bytes']) / 2**20:.1f} MiB")  # type: ignore[call-overload]
    pack_source(source, args.source)
    log(f"llama.cpp source {args.source}: {args.source.stat().st_size / 2**20:.1f} MiB")
    rel = bundle.relative_to(REPO)
    print("\nDevice call 1 (stage, ~7 min):  carry "
          f"{rel}/wheels {rel}/debs {rel}/manifest.json {rel}/install.sh {args.source.relative_to(REPO)}\n"
          "    PYTHONUNBUFFERED=1 python3 bench/gpu.py stage\n"
          f"Device call 2 (run, ~4 min), at once after call 1:  carry {rel}/temporal.xz {rel}/manifest.json\n"
          "    PYTHONUNBUFFERED=1 python3 bench/gpu.py run\n"
          "Device call 3 (campaign, ~6 min), at once after call 2: carry the same as call 2\n"
          "    PYTHONUNBUFFERED=1 python3 bench/gpu.py campaign")  # fmt: skip


def pack_source(source: Path, tarball: Path) -> None:
    """The parts of the llama.cpp tree a build reads, as <tarball> (xz), laid out as the engine cache keeps it."""
    tarball.parent.mkdir(parents=True, exist_ok=True)
    top = Path(f"llama-cpp-python-{LLAMA_CPP_PYTHON}") / "vendor" / "llama.cpp"
    partial = tarball.with_suffix(".partial")
    with tarfile.open(partial, "w:xz") as tar:
        for part in SOURCE_PARTS:
            if (source / part).exists():
                tar.add(source / part, arcname=str(top / part))
    partial.replace(tarball)


# --- phase 1, under the host's bare python: the standard library only ------------------------------------------


def stage_bundle(carried: Path, staged: Path) -> None:
    """Copy what this call carried into the staged bundle; drop what the carried manifest no longer lists.
    Files the manifest lists but this call did not carry stay as an earlier call left them."""
    manifest = carried / "manifest.json"
    if not manifest.is_file():
        if not (staged / "manifest.json").is_file():
            raise SystemExit(
                f"no bundle at {carried} and none staged at {staged}: carry .gpu/bundle (see pack)"
            )
        return
    staged.mkdir(parents=True, exist_ok=True)
    for path in sorted(carried.rglob("*")):
        if path.is_file():
            target = staged / path.relative_to(carried)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            target.chmod(path.stat().st_mode & 0o777)
    listed = {entry["path"] for entry in json.loads(manifest.read_text())["files"]} | {"manifest.json"}
    for path in sorted(staged.rglob("*")):
        if path.is_file() and str(path.relative_to(staged)) not in listed:
            path.unlink()


def unpack_source(tarball: Path, cache: Path) -> None:
    """The trimmed llama.cpp tree into <cache>/src (once per tarball)."""
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()[:16]
    marker = cache / "src" / f".unpacked-{digest}"
    if marker.is_file():
        return
    (cache / "src").mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(cache / "src", filter="data")
    marker.write_text(str(tarball))
    log(f"llama.cpp source unpacked under {cache / 'src'}")


def bootstrap(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO / "src"))
    from daedalus.hosts.bundle_install import ensure_installed

    staged = args.work / "bundle"
    stage_bundle(args.bundle, staged)
    venv = args.work / "venv"
    started = time.monotonic()
    ensure_installed(staged, venv, python=sys.executable, progress=log)
    install_s = time.monotonic() - started
    log(f"bundle installed in {install_s:.1f} s")
    cache = Path(os.environ.get("DAEDALUS_CACHE_DIR", args.work / "cache"))
    if args.command == "stage" and args.source.is_file():
        unpack_source(args.source, cache)
    cuda = "/usr/local/cuda/bin"
    steps_env = args.work / STEPS_ENV
    env = {
        **(
            json.loads(steps_env.read_text())
            if args.command in ("run", "campaign") and steps_env.is_file()
            else {}
        ),
        **os.environ,
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}:{cuda}",
        "DAEDALUS_HOME": os.environ.get("DAEDALUS_HOME", str(args.work / ".daedalus")),
        "DAEDALUS_CACHE_DIR": str(cache),
        "DAEDALUS_HOSTS_FILE": os.environ.get("DAEDALUS_HOSTS_FILE", str(args.work / "hosts.yaml")),
        "DAEDALUS_HOST": HOST,
        "GPU_BENCH_INSTALL_S": f"{install_s:.2f}",
        "GPU_BENCH_BASE_PYTHON": sys.executable,
    }
    python = str(venv / "bin" / "python")
    os.execve(python, [python, str(Path(__file__).resolve()), *sys.argv[1:], "--installed"], env)


# --- phase 2, inside the venv ----------------------------------------------------------------------------------


def engine_settings() -> Any:
    """The one Settings of this process; its engine section goes to the engine code (DAEDALUS_CACHE_DIR)."""
    from daedalus.config import Settings
    from daedalus.engines import paths

    settings = Settings.load()
    paths.configure(settings.engines)
    return settings


def installed_report() -> dict[str, Any]:
    """What phase 2 runs with (the CPU test reads it: `--install-only`)."""
    import daedalus.cli
    from daedalus.engines.paths import cache_root, default_llama_source
    from daedalus.sandbox import bwrap_binary

    return {
        "python": sys.executable,
        "prefix": sys.prefix,
        "daedalus": str(Path(daedalus.cli.__file__).resolve().parents[1]),
        "cache_root": str(cache_root()),
        "llama_source": str(default_llama_source()),
        "bwrap": bwrap_binary(),
    }


def write_registry(path: Path, gpus: int, model: str, memory_gib: float) -> Any:
    """hosts.yaml for this host: its real GPUs, so the ticket's gates and the training run lease them."""
    import yaml

    from daedalus.hosts.registry import load_registry

    entry = {"name": HOST, "description": "the GPU host bench/gpu.py runs on",
             "gpus": {"count": gpus, "model": model, "memory_gib": round(memory_gib, 1)},
             "schedule_to_start_s": 600}  # fmt: skip
    path.write_text(yaml.safe_dump({"hosts": [entry]}))
    return load_registry(path)


def record_gpus(out: Path | None, suffix: str = "") -> dict[str, Any]:
    """nvidia-smi -q -x, its compute capabilities and NVML's answers, as the host gives them (CPU fixtures)."""
    import pynvml  # type: ignore[import-not-found]

    from daedalus.hosts.gpu_probe import COMPUTE_CAP_QUERY, RecordingNvml, read_nvml

    xml = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, check=True).stdout
    caps = subprocess.run(
        ["nvidia-smi", *COMPUTE_CAP_QUERY], capture_output=True, text=True, check=True
    ).stdout
    recording = RecordingNvml(pynvml)
    report = read_nvml(recording)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"nvidia-smi{suffix}.xml").write_text(xml)
        recording.save(out / f"nvml{suffix}.json")
        if not suffix:
            (out / "nvidia-smi-compute-cap.csv").write_text(caps)
    return report.as_json()


def stage(args: argparse.Namespace) -> None:
    from daedalus.cli._common import run
    from daedalus.engines.llama_build import BuildConfig, build_llama_cpp
    from daedalus.engines.paths import default_llama_source
    from daedalus.engines.tiny_model import ensure_model
    from daedalus.hosts.check import check_host

    settings = engine_settings()
    figures: dict[str, Any] = {"install_s": float(os.environ.get("GPU_BENCH_INSTALL_S", "nan"))}
    nvml = record_gpus(args.out)
    figures["nvml"] = nvml
    base = os.environ.get("GPU_BENCH_BASE_PYTHON", "python3")
    pip_list = subprocess.run([base, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                              check=False).stdout  # fmt: skip
    if args.out is not None:
        (args.out / "pip-list.json").write_text(pip_list)
    gpus = nvml["gpus"]
    write_registry(settings.hosts_file, len(gpus), gpus[0]["name"], gpus[0]["memory_total_mib"] / 1024)
    archs = tuple(sorted({g["compute_capability"].replace(".", "") for g in gpus}))
    if args.no_build:
        figures["host_fixes"] = fit_steps_to_host(args.work)
        check = run(check_host(engine_settings(), HOST, send=False))
        figures["host_check"] = check.model_dump(mode="json")
        for line in check.lines:
            log(
                f"  {line.status.value:4} {line.name}: {line.detail} {('FIX: ' + line.fix) if line.fix else ''}"
            )
        if args.out is not None:
            (args.out / "stage.json").write_text(json.dumps(figures, indent=2, default=str) + "\n")
        return
    started = time.monotonic()
    shown = [0]

    def progress(done: int, total: int, _line: str) -> None:
        if done * 10 // total > shown[0]:
            shown[0] = done * 10 // total
            log(f"CUDA build {done}/{total}")

    build = run(build_llama_cpp(default_llama_source(), jobs=os.cpu_count() or 8, on_progress=progress,
                                config=BuildConfig.for_backend("cuda", archs)))  # fmt: skip
    figures["build_wall_s"] = round(time.monotonic() - started, 1)
    figures["build_dir"] = str(build.build_dir)
    log(f"CUDA build {build.bin_dir} in {figures['build_wall_s']} s")
    started = time.monotonic()
    model = ensure_model(MODEL)
    figures["model_s"] = round(time.monotonic() - started, 1)
    figures["host_fixes"] = fit_steps_to_host(args.work)
    settings = engine_settings()  # with what the fixes set
    check = run(check_host(settings, HOST, send=False))
    figures["host_check"] = check.model_dump(mode="json")
    log(f"host check (not sent; Temporal is not up in this call): {check.summary()}")
    for line in check.lines:
        log(f"  {line.status.value:4} {line.name}: {line.detail} {('FIX: ' + line.fix) if line.fix else ''}")
    log(f"model {model}")
    if args.out is not None:
        (args.out / "stage.json").write_text(json.dumps(figures, indent=2, default=str) + "\n")


STEPS_ENV = "steps-env.json"
"""Settings `stage` found this host's confined steps need; `run` starts with them (the work directory keeps it)."""


def fit_steps_to_host(work: Path) -> list[str]:
    """Do what the `gpus-in-steps` check names, as the host's operator would, until a step's sandbox reaches the
    GPUs: the driver's device nodes, its libraries in the linker cache, /sys for the driver. Returns what was
    done; what `run` must set too is kept in <work>/steps-env.json."""
    from daedalus.config import Settings
    from daedalus.hosts.check import LINKER_FIX, CheckStatus, check_gpus_in_steps, context

    def probe() -> Any:
        line = check_gpus_in_steps(context(Settings.load(), HOST))
        log(f"gpus-in-steps: {line.status.value}: {line.detail} {('FIX: ' + line.fix) if line.fix else ''}")
        return line

    done: list[str] = []
    line = probe()
    if line.status is CheckStatus.FAIL and not Path("/dev/nvidia-uvm").exists():
        modprobe = shutil.which("nvidia-modprobe")
        command = (
            [modprobe, "-u", "-c=0"]
            if modprobe
            else [sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1').cuInit(0)"]
        )
        subprocess.run(command, check=False)
        done.append(f"created the driver's device nodes: {' '.join(command)}")
        line = probe()
    if line.status is CheckStatus.FAIL and line.fix == LINKER_FIX:
        dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":")
                if d and any((Path(d) / lib).exists() for lib in ("libcuda.so.1", "libnvidia-ml.so.1"))]  # fmt: skip
        if dirs:
            Path("/etc/ld.so.conf.d/zz-daedalus-gpu-driver.conf").write_text("\n".join(dirs) + "\n")
            subprocess.run(["ldconfig"], check=False)
            done.append(f"added {dirs} (from LD_LIBRARY_PATH) to the linker cache")
            line = probe()
    env: dict[str, str] = {}
    if line.status is CheckStatus.FAIL:
        os.environ["DAEDALUS_STEPS_READ_ONLY"] = env["DAEDALUS_STEPS_READ_ONLY"] = json.dumps(["/sys"])
        line = probe()
        if line.status is CheckStatus.FAIL:
            del os.environ["DAEDALUS_STEPS_READ_ONLY"]
            env = {}
        else:
            done.append("steps see /sys read-only (DAEDALUS_STEPS_READ_ONLY)")
    (work / STEPS_ENV).write_text(json.dumps(env))
    return done


def serving_repo(root: Path, archs: list[str]) -> Path:
    """A serving-config repo whose single-user lane runs f16 KV without flash attention (the base commit); the
    presets name the GPUs' architectures (a build in a step's sandbox does not ask nvidia-smi)."""
    import yaml

    repo = root / "serving-config"
    if repo.exists():
        shutil.rmtree(repo)
    (repo / "presets").mkdir(parents=True)
    presets = REPO / "src" / "daedalus" / "engines" / "shipped_presets"  # the GPU presets a wheel ships
    for source, name in (("gpu-f16-nofa.yaml", "serve"), ("gpu-f16.yaml", "gpu-f16")):
        preset = yaml.safe_load((presets / source).read_text())
        preset["name"] = name
        preset["cuda_architectures"] = archs
        (repo / "presets" / f"{name}.yaml").write_text(yaml.safe_dump(preset, sort_keys=False))
    git = ["git", "-c", "user.name=gpu-bench", "-c", "user.email=gpu-bench@daedalus.local"]
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], [*git, "commit", "-qm", "base"]):
        subprocess.run(cmd, cwd=repo, check=True)
    return repo


def patch_to_q8_0(repo: Path) -> str:
    """The scripted agent's patch: the lane switches to a q8_0 KV cache with flash attention on."""
    serve = repo / "presets" / "serve.yaml"
    before = serve.read_text()
    after = (before.replace("cache_type_k: f16", "cache_type_k: q8_0").replace("cache_type_v: f16", "cache_type_v: q8_0")
             .replace("flash_attn: 'off'", "flash_attn: 'on'"))  # fmt: skip
    if after == before or "flash_attn: 'on'" not in after:
        raise SystemExit(f"the q8_0 patch did not apply to {serve}:\n{before}")
    serve.write_text(after)
    diff = subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True, check=True).stdout
    subprocess.run(["git", "checkout", "--", "."], cwd=repo, check=True)
    return diff


def ticket_spec(
    repo: Path, archs: list[str], decode_threshold: float, floor_threshold: float
) -> dict[str, Any]:
    measure = (
        f"daedalus engine measure {{metric}} --preset presets/serve.yaml --model {MODEL} --max-tokens {N_GEN}"
    )
    arch_flags = " ".join(f"--cuda-arch {a}" for a in archs)
    return {
        "id": "h200-4",
        "title": "H200 single-user lane: q8_0 KV with flash attention, fast and temp-0 identical to f16 KV",
        "kind": "fix",
        "engine": {"name": f"llama.cpp (vendored by llama-cpp-python {LLAMA_CPP_PYTHON}), CUDA", "kind": "llama_cpp",
                   "repo": str(repo), "base_commit": "main", "preset": "serve"},
        "host": HOST,
        "agent": {"name": "scripted", "patch": patch_to_q8_0(repo)},
        "spec": "Switch the single-user lane (presets/serve.yaml) to a q8_0 KV cache with flash attention on. "
                f"Acceptance, modelled on ticket 4: decode >= {decode_threshold:g} tok/s; at least "
                f"{floor_threshold:g} of the bandwidth floor; temp-0 output identical to f16 KV (or a near-tie "
                "flip, logprob gap < 0.25); KV cache <= 24 KiB/token by NVML difference (f16 is 32).",
        "constraints": ["touch only presets/"],
        "allowed_paths": ["presets"],
        "build": {"command": f"daedalus engine build --backend cuda {arch_flags} --jobs 16", "timeout_s": 1800},
        "gates": [
            {"name": "decode", "metric": "decode_tps", "threshold": decode_threshold,
             "command": measure.format(metric="decode_tps")},
            {"name": "bandwidth-floor", "metric": "floor_fraction", "threshold": floor_threshold,
             "command": measure.format(metric="floor_fraction")},
            {"name": "temp0-identity-vs-f16-kv", "metric": "temp0_identity", "threshold": 1.0,
             "command": f"daedalus engine measure temp0_identity --preset presets/serve.yaml "
                        f"--baseline-preset presets/gpu-f16.yaml --model {MODEL} --probes 16"},
            {"name": "kv-kib-per-token", "metric": "kib_per_token", "threshold": 24.0,
             "command": f"daedalus engine measure kib_per_token --preset presets/serve.yaml --model {MODEL}"},
        ],
        "approval": {"deciders": ["wayne"], "delegates": {"dispatch": ["lead"]}},
        "max_attempts": 1,
    }  # fmt: skip


def training_spec(work: Path, python: str) -> dict[str, Any]:
    """examples/training/h200-leak.yaml, with this venv's python and paths under the work directory."""
    import yaml

    spec: dict[str, Any] = yaml.safe_load((REPO / "examples" / "training" / "h200-leak.yaml").read_text())
    spec["command"][0] = python
    spec["cwd"] = str(work)
    spec["checkpoints"]["directory"] = str(work / "checkpoints" / spec["name"])
    spec["hunt"]["engine"]["repo"] = str(REPO)
    return spec


async def harness_fidelity(build: Any, model: Path, work: Path, out: Path | None) -> dict[str, Any]:
    import statistics

    from daedalus.engines.bench import Side, benchmark
    from daedalus.engines.presets import load_preset
    from daedalus.engines.runner import launched
    from daedalus.schemas.engines import Workload

    preset = load_preset("gpu-f16")  # shipped in the package: found on a host with no source checkout
    workload = Workload(users=[1], rounds=7, warmup_rounds=1, max_tokens=N_GEN, prompt_words=16)
    async with launched(preset, model, work / "fidelity", build=build) as server:
        result = await benchmark(Side(preset.name, server), workload, run_id="gpu-fidelity", model=str(model))
        busy = record_gpus(out, suffix="-busy")  # the GPU with llama-server on it: memory used, a process
    if not result.valid:
        raise SystemExit(f"GPU benchmark INVALID: {result.invalid_reasons}")
    measured = [q for rnd in result.rounds if not rnd.warmup for q in rnd.requests]
    ratios = [q.client_decode_tps / q.server_decode_tps for q in measured
              if q.client_decode_tps and q.server_decode_tps]  # fmt: skip
    done = subprocess.run([str(build.binary("llama-bench")), "-m", str(model), "-p", "0", "-n", str(N_GEN),
                           "-ngl", "99", "-fa", "on", "-r", "5", "-o", "json"],
                          capture_output=True, text=True, check=True, timeout=600)  # fmt: skip
    return {
        "server_timings_ratio_median": statistics.median(ratios),
        "decode_tps_median": statistics.median(result.results[0].decode_tps),
        "client_decode_tps_median": statistics.median(result.results[0].client_decode_tps),
        "llama_bench_tg_tps": float(json.loads(done.stdout)[0]["avg_ts"]),
        "gpu_busy": busy,
    }


async def drive_ticket(stack: Any, spec_data: dict[str, Any], registry: Any, deadline_s: float) -> Any:
    import asyncio

    from daedalus import services as tickets
    from daedalus.decisions.schemas import TicketSubject
    from daedalus.schemas.ticket import Decision, DecisionKind

    spec = tickets.parse_spec(spec_data, "bench/gpu.py ticket")
    handle = await tickets.file_ticket(
        stack.client, spec, queue=stack.settings.temporal.control_queue, filed_by="gpu-bench", hosts=registry
    )
    log(f"filed ticket {spec.id} ({handle.id}) on host {spec.host}")
    result = asyncio.ensure_future(handle.result())
    started = time.monotonic()
    last_status = ""
    while not result.done():
        state = await tickets.status(stack.client, spec.id)
        if state.status.value != last_status:
            last_status = state.status.value
            log(f"ticket {spec.id}: {last_status}")
        request = state.pending_decision
        if request is not None and request.kind is DecisionKind.DISPATCH:
            log(f"lead approves {request.id} (delegated by wayne in the spec)")
            await tickets.decide(stack.client, Decision(request_id=request.id, option="approve", decided_by="lead",
                                                        channel="bot", note="bench/gpu.py"),
                                 subject=request.subject or TicketSubject(ticket_id=spec.id))  # fmt: skip
        elif request is not None and request.kind is DecisionKind.ESCALATION:
            log(f"escalated: {request.question}; the bench stops here (the decider would answer)")
            return state
        if time.monotonic() - started > deadline_s:
            log("ticket deadline passed")
            return state
        await asyncio.wait({result}, timeout=1.0)
    return result.result()


async def drive_training(stack: Any, spec_data: dict[str, Any], registry: Any, deadline_s: float) -> Any:
    import asyncio

    from daedalus.schemas.training import StopTraining
    from daedalus.services.training import parse_run_spec, start_run, stop_run
    from daedalus.workflows.training import TrainingRunWorkflow

    spec = parse_run_spec(spec_data, "bench/gpu.py training run")
    handle = await start_run(stack.client, spec, queue=stack.settings.temporal.control_queue, hosts=registry,
                             started_by="gpu-bench")  # fmt: skip
    log(f"started training run {spec.name} on {spec.host}")
    started = time.monotonic()
    seen = -1
    status = await handle.query(TrainingRunWorkflow.status)
    while time.monotonic() - started < deadline_s:
        status = await handle.query(TrainingRunWorkflow.status)
        if len(status.deaths) != seen:
            seen = len(status.deaths)
            if status.deaths:
                d = status.deaths[-1]
                log(f"death {seen}: {d.death_class.value} ({d.summary}); checkpoint {d.last_checkpoint}")
        if status.hunting_tickets:
            break
        await asyncio.sleep(1.0)
    # The run now waits for a decider and still holds its GPU lease: stop it, as a decider would, so the GPU is
    # free for the campaign call (whose cells otherwise wait for the lease until their deadline, as they did).
    await stop_run(
        stack.client,
        spec.name,
        StopTraining(requested_by="gpu-bench", reason="measured; GPU to the campaign"),
    )
    try:
        await asyncio.wait_for(handle.result(), timeout=120)
    except Exception as error:  # the figures above stand; the campaign call says if the GPU is still held
        log(f"training run {spec.name} did not end after the stop: {error!r}")
    return status


def gpu_curve(deaths: list[Any]) -> dict[str, float | None]:
    import csv

    used: list[int] = []
    util: list[int] = []
    for death in deaths:
        if not death.curve_path or not Path(death.curve_path).is_file():
            continue
        with Path(death.curve_path).open() as handle:
            for row in csv.DictReader(handle):
                if row.get("gpu_used_bytes"):
                    used.append(int(row["gpu_used_bytes"]))
                if row.get("gpu_util_pct"):
                    util.append(int(row["gpu_util_pct"]))
    return {
        "training_gpu_used_gib_max": max(used) / 2**30 if used else None,
        "training_gpu_util_pct_max": float(max(util)) if util else None,
        "training_curve_samples": float(len(used)),
    }


def gate_figures(state: Any) -> dict[str, Any]:
    results = [g for a in state.attempts for g in a.gate_results]
    return {g.gate: {"verdict": g.verdict.value, "median": g.median, "ci": [g.ci_low, g.ci_high], "unit": g.unit,
                     "n": len(g.samples), "samples": g.samples, "method": g.method, "reason": g.reason,
                     "lease": g.lease.model_dump(mode="json") if getattr(g, "lease", None) else None}
            for g in results}  # fmt: skip


async def run_installed(args: argparse.Namespace) -> dict[str, Any]:
    from daedalus.engines.gpu import copy_bandwidth, floor_tps, model_bytes_per_token
    from daedalus.engines.llama_build import BuildConfig, build_root, cached_build, source_hash
    from daedalus.engines.measure import ensure_build
    from daedalus.engines.paths import default_llama_source
    from daedalus.engines.tiny_model import ensure_model
    from daedalus.hosts.check import check_host
    from daedalus.hosts.holder import keeper_state
    from daedalus.sandbox import bwrap_binary
    from daedalus.stack import running_stack

    settings = engine_settings()
    figures: dict[str, Any] = {"install_s": float(os.environ.get("GPU_BENCH_INSTALL_S", "nan"))}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                          "--format=csv,noheader"], capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    figures["device"] = smi
    figures["bwrap"] = bwrap_binary()
    log(f"device: {smi}; bwrap {figures['bwrap']}")
    archs = sorted({line.split(",")[-1].strip().replace(".", "") for line in smi.splitlines()})
    memory_gib = float(smi.splitlines()[0].split(",")[1].strip().split()[0]) / 1024
    registry = write_registry(
        settings.hosts_file, len(smi.splitlines()), smi.split(",")[0].strip(), memory_gib
    )
    config = BuildConfig.for_backend("cuda", archs)
    source = default_llama_source()
    figures["build_cached"] = cached_build(source, config) is not None
    build = await ensure_build(source, config)
    info = json.loads((build_root(config.cache_key(source_hash(source))) / "build.json").read_text())
    figures["build_s"] = info["seconds"]
    figures["build_flags"] = " ".join(info["flags"][-2:])
    log(f"CUDA build {build.bin_dir} ({info['seconds']} s, cached={figures['build_cached']})")
    model = ensure_model(MODEL)
    figures.update(await harness_fidelity(build, model, args.work, args.out))
    bandwidth = copy_bandwidth()
    per_token = model_bytes_per_token(model)
    floor = floor_tps(bandwidth.gbs, per_token)
    figures.update({"copy_bandwidth_gbs": bandwidth.gbs, "model_bytes_per_token": per_token,
                    "bandwidth_floor_tps": floor, "floor_fraction": figures["decode_tps_median"] / floor})  # fmt: skip
    log("fidelity: " + json.dumps({k: v for k, v in figures.items() if k != "gpu_busy"}, default=str))

    repo = serving_repo(args.work, archs)
    spec_data = ticket_spec(repo, archs, args.decode_threshold, args.floor_threshold)
    async with running_stack(settings, hosts=[HOST], embedded=True) as stack:
        check = await check_host(settings, HOST)
        figures["host_check"] = check.model_dump(mode="json")
        kept = (await keeper_state(stack.client, HOST)).last_check
        figures["host_check_kept_by_keeper"] = kept is not None and kept.check.checked_at == check.checked_at
        log(f"host check: {check.summary()}")
        for line in check.lines:
            log(
                f"  {line.status.value:4} {line.name}: {line.detail} {('FIX: ' + line.fix) if line.fix else ''}"
            )
        if args.out is not None:
            (args.out / "check.json").write_text(json.dumps(figures["host_check"], indent=2) + "\n")
        state = await drive_ticket(stack, spec_data, registry, deadline_s=args.ticket_deadline_s)
        figures["ticket_status"] = state.status.value
        figures["gates"] = gate_figures(state)
        figures["attempts"] = [f"{a.number}: {a.outcome.value} {a.detail}" for a in state.attempts]
        log(
            f"ticket {state.spec.id}: {state.status.value}; gates {json.dumps(figures['gates'], default=str)}"
        )
        status = await drive_training(stack, training_spec(args.work, sys.executable), registry,
                                      args.training_deadline_s)  # fmt: skip
        figures["training_deaths"] = len(status.deaths)
        figures["training_graceful_stops"] = sum(
            1 for d in status.deaths if d.death_class.value == "watchdog_stop"
        )
        figures["training_death_classes"] = [d.death_class.value for d in status.deaths]
        figures["hunting_tickets"] = status.hunting_tickets
        figures.update(gpu_curve(status.deaths))
    figures["store_file"] = str(settings.home / "daedalus.db")
    return figures


CAMPAIGN = REPO / "examples" / "campaigns" / "h200-engine-settings.yaml"
CAMPAIGN_RESULT = REPO / "bench" / "results" / "gpu-campaign.json"
DEFAULT_CELL = {"kv": "f16", "flash_attn": "on", "batch": "2048 (ub 512)", "threads": "4"}
"""The cell that is llama.cpp's default serving preset here (gpu-f16: f16 KV, flash attention, llama-server's
default batch 2048 and micro-batch 512, 4 threads): what the proposal is compared with."""


async def run_campaign(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio
    from datetime import UTC, datetime, timedelta

    from daedalus.campaigns.spec import load_campaign
    from daedalus.report import build_report, render_markdown
    from daedalus.schemas.campaigns import CampaignInput, campaign_workflow_id
    from daedalus.stack import running_stack
    from daedalus.store import queries
    from daedalus.store.database import session_scope
    from daedalus.workflows.campaign import CLOSED_STATES, CampaignWorkflow

    settings = engine_settings()
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    gpus = smi.splitlines()
    write_registry(settings.hosts_file, len(gpus), gpus[0].split(",")[0].strip(),
                   float(gpus[0].split(",")[1].strip().split()[0]) / 1024)  # fmt: skip
    spec = load_campaign(CAMPAIGN)
    started_at = datetime.now(UTC) - timedelta(minutes=1)
    figures: dict[str, Any] = {"campaign": spec.id, "device": smi, "cells_total": len(spec.cells())}
    async with running_stack(settings, hosts=[HOST], embedded=True) as stack:
        queue = settings.temporal.control_queue
        handle = await stack.client.start_workflow(
            CampaignWorkflow.run,
            CampaignInput(spec=spec, control_queue=queue, filed_by="gpu-bench", host_gpus=len(gpus)),
            id=campaign_workflow_id(spec.id),
            task_queue=queue,
        )
        log(f"campaign {spec.id}: {len(spec.cells())} cells on {HOST}")
        started, done = time.monotonic(), -1
        status = await handle.query(CampaignWorkflow.status)
        # the campaign's own end states, and a proposal waiting for a decider (the bench does not answer it)
        while status.status not in (*CLOSED_STATES, "awaiting_decision"):
            if time.monotonic() - started > args.campaign_deadline_s:
                log("campaign deadline passed: what was measured is kept")
                break
            await asyncio.sleep(2.0)
            status = await handle.query(CampaignWorkflow.status)
            if status.cells_done != done:
                done = status.cells_done
                log(f"campaign: {done}/{status.cells_total} cells, {status.cells_crashed} crashed")
        figures["campaign_s"] = round(time.monotonic() - started, 1)
        figures["status"] = status.status
        figures["proposal"] = status.proposal.model_dump(mode="json") if status.proposal else None
        assert stack.engine is not None
        with session_scope(stack.engine) as session:
            rows = queries.campaign_cells(session=session, campaign_id=spec.id)
            figures["cells"] = [
                {"cell": r.cell, "preset": r.preset, "axes": r.axes, "outcome": r.outcome, "detail": r.detail,
                 "decode_tps": r.decode_tps, "ci": [r.ci_low, r.ci_high], "samples": r.samples,
                 "kib_per_token": r.kib_per_token, "needle": [r.needle_found, r.needle_total],
                 "eligible": r.feasible, "floor_fraction": _float(r.evidence.get("floor_fraction")),
                 "floor_ci": [_float(r.evidence.get("floor_ci_low")), _float(r.evidence.get("floor_ci_high"))],
                 "copy_bandwidth_gbs": _float(r.evidence.get("copy_bandwidth_gbs"))}
                for r in rows
            ]  # fmt: skip
            report = render_markdown(build_report(session=session, since=started_at))
        await handle.cancel()  # the proposal is for a decider; the bench does not answer it
    default = next((c for c in figures["cells"] if DEFAULT_CELL.items() <= c["axes"].items()), None)
    proposed = next(
        (c for c in figures["cells"] if figures["proposal"] and c["preset"] == figures["proposal"]["preset"]),
        None,
    )
    figures["default_cell"], figures["proposed_cell"] = default, proposed
    figures["report_section"] = (
        report[report.find("## Campaigns") :].split("\n## ")[0] if "## Campaigns" in report else ""
    )
    return figures


def _float(value: str | None) -> float | None:
    return float(value) if value else None


def finish_campaign(figures: dict[str, Any], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"campaign {figures['campaign']} on {figures['device']}: {figures['status']}")
    for column in (
        "preset",
        "outcome",
        "decode tok/s [90%]",
        "floor fraction [90%]",
        "KiB/token",
        "eligible",
    ):
        table.add_column(column)
    for c in figures["cells"]:
        tps = f"{c['decode_tps']:.1f} [{c['ci'][0]:.1f}, {c['ci'][1]:.1f}]" if c["ci"][0] is not None else "-"
        floor = (
            f"{c['floor_fraction']:.3f} [{c['floor_ci'][0]:.3f}, {c['floor_ci'][1]:.3f}]"
            if c["floor_ci"][0] is not None
            else "-"
        )
        table.add_row(c["preset"], c["outcome"] if c["outcome"] == "measured" else f"{c['outcome']}: {c['detail'][:60]}",
                      tps, floor, f"{c['kib_per_token']:.1f}" if c["kib_per_token"] else "-", str(c["eligible"]))  # fmt: skip
    Console(width=200).print(table)
    print("proposal:", (figures["proposal"] or {}).get("reason", "none"))
    source = json.loads((args.work / "bundle" / "manifest.json").read_text()).get("source", {})
    figures["commit"], figures["commit_dirty"] = source.get("commit", ""), source.get("dirty")
    CAMPAIGN_RESULT.parent.mkdir(parents=True, exist_ok=True)
    CAMPAIGN_RESULT.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copy(CAMPAIGN_RESULT, args.out / "gpu-campaign.json")
        (args.out / "campaign-report.md").write_text(figures["report_section"])
        # the cells' server logs: what a cell that did not finish was doing
        pack_logs(engine_settings().home / "artifacts", args.out / "cell-logs.tar.xz")


def finish(figures: dict[str, Any], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Daedalus on the GPU host")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        if key not in ("gates", "host_check", "gpu_busy"):
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    for gate, verdict in figures.get("gates", {}).items():
        table.add_row(f"gate {gate}", f"{verdict['verdict']}: {verdict['reason']}")
    Console(width=160).print(table)
    source = json.loads((args.work / "bundle" / "manifest.json").read_text()).get("source", {})
    figures["commit"] = source.get("commit", "")  # the commit the bundle's Daedalus was built from
    figures["commit_dirty"] = source.get("dirty")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    if args.out is None:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copy(RESULT, args.out / "gpu.json")
    store = Path(figures["store_file"])
    if store.is_file():
        import sqlite3

        # The backup API copies a consistent database, WAL included.
        with sqlite3.connect(store) as src, sqlite3.connect(args.out / "store.sqlite") as dst:
            src.backup(dst)
    env = {**os.environ, "COLUMNS": "160"}
    with (args.out / "report-audit.txt").open("w") as text:
        for command in (["report", "--since", "24h"], ["audit", "--since", "24h"], ["hosts"]):
            done = subprocess.run(
                ["daedalus", *command], capture_output=True, text=True, check=False, env=env
            )
            text.write(f"$ daedalus {' '.join(command)}\n{done.stdout}{done.stderr}\n")
    # The steps' own logs (agent, build, gates, training), for a ticket that did not pass.
    pack_logs(Path(figures["store_file"]).parent / "artifacts", args.out / "step-logs.tar.xz")


def pack_logs(artifacts: Path, tarball: Path) -> None:
    """Every log under a store's artifacts (a step's, a cell's server), each under 8 MiB, into one tarball."""
    with tarfile.open(tarball, "w:xz") as tar:
        for path in sorted(artifacts.rglob("*.log")) if artifacts.is_dir() else []:
            if path.stat().st_size < 8 * 2**20:
                tar.add(path, arcname=str(path.relative_to(artifacts)))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("command", choices=("pack", "stage", "run", "campaign"))
    parser.add_argument("--bundle", type=Path, default=GPU_DIR / "bundle", help="the bundle carried here")
    parser.add_argument(
        "--source", type=Path, default=GPU_DIR / "llama.cpp.tar.xz", help="the llama.cpp source"
    )
    parser.add_argument("--work", type=Path, default=Path.home() / "tmp" / "daedalus-gpu")
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    )
    parser.add_argument("--decode-threshold", type=float, default=300.0)
    parser.add_argument("--floor-threshold", type=float, default=0.15)
    parser.add_argument("--ticket-deadline-s", type=float, default=420.0)
    parser.add_argument("--training-deadline-s", type=float, default=150.0)
    parser.add_argument("--campaign-deadline-s", type=float, default=470.0)
    parser.add_argument("--no-build", action="store_true", help="stage: install, record and check only")
    parser.add_argument("--install-only", action="store_true",
                        help="stop once installed: print what the venv runs with, as JSON")  # fmt: skip
    parser.add_argument("--installed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.bundle, args.source, args.work = args.bundle.resolve(), args.source.resolve(), args.work.resolve()
    if args.command == "pack":
        pack(args)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.installed:
        bootstrap(args)
        return
    if args.install_only:
        engine_settings()
        print(json.dumps(installed_report()))
        return
    if args.command == "stage":
        stage(args)
        return
    import asyncio

    if args.command == "campaign":
        finish_campaign(asyncio.run(run_campaign(args)), args)
    else:
        finish(asyncio.run(run_installed(args)), args)
    sys.stdout.flush()
    os._exit(0)  # the Temporal client's threads can abort a finalizing interpreter (see cli/__init__.py)


if __name__ == "__main__":
    main()
