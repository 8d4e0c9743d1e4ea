"""`daedalus host check`: a host says whether it can do its job before it takes work.

Each check is one line (ok, warn, fail or skip) with what it saw and, for a failure, what to do about it:

* packages   Daedalus's dependencies are installed in versions it accepts, and the worker's modules import;
* sandbox    bubblewrap (the host's, or the bundle's) starts a sandbox with every namespace the agents need
             unshared from the worker's;
* steps      a build's or gate's sandbox runs Daedalus itself (`python -c "import daedalus.engines.measure"`):
             every directory the installation reads from (an image's own venv too) is visible there;
* gpus       for a host declared with GPUs: nvidia-smi and NVML agree on them, their number is the registry's,
             compute capability and free memory read, and a step's sandbox with the GPUs' device nodes
             sees them;
* engine     the llama.cpp source and the build this host's gates need (CUDA for its architectures) exist;
* temporal   Temporal answers at the configured address with the configured TLS or API key;
* disk       room for engine builds (the engine cache) and for checkpoints and artifacts (home);
* clock      this host's clock against Temporal's, read from the host's lease keeper (which keeps the
             check: `daedalus hosts` shows each host's last one).

`daedalus worker` runs it at start and does not poll the queue of a host whose check failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import importlib
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from daedalus.config import Settings
from daedalus.engines import paths
from daedalus.errors import BadSettings, RegistryError, SandboxError
from daedalus.hosts.gpu_probe import (
    COMPUTE_CAP_QUERY,
    GpuReadError,
    GpuReport,
    disagreements,
    parse_compute_caps,
    parse_nvidia_smi_xml,
    read_nvml,
)
from daedalus.hosts.registry import HostSpec, load_registry
from daedalus.schemas.host_check import CheckLine, CheckStatus, HostCheck, HostCheckReceipt

GIB = 1024**3
MIN_FREE_CACHE_GIB = 20.0
"""A CUDA build of llama.cpp and a few GGUF models (the 1B test model is 2 GiB)."""
MIN_FREE_HOME_GIB = 10.0
"""Checkpoints (the trainers keep the latest K), logs and raw benchmark samples."""
MIN_FREE_GPU_FRACTION = 0.5
"""Less free than this on a GPU at start: someone else holds it (a tenant should be paused by a lease)."""
MAX_CLOCK_SKEW_S = 5.0
"""Lease expiry, heartbeat deadlines and the audit trail's order assume the hosts' clocks agree with Temporal's
to within seconds."""
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")
REQUIRED_NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts")
"""cgroup is unshared where the kernel can (`--unshare-cgroup-try`): its absence is a warning."""
STEP_IMPORT = "daedalus.engines.measure"


@dataclass(frozen=True)
class CheckContext:
    """What the checks read: the settings, this host's registry entry (None: not declared) and where to run."""

    settings: Settings
    host: str
    spec: HostSpec | None
    registry_problem: str = ""
    registry_readable: bool = True

    @property
    def real_gpus(self) -> int:
        if self.spec is None or self.spec.gpus.simulated:
            return 0
        return self.spec.gpus.count


def context(settings: Settings, host: str) -> CheckContext:
    try:
        registry = load_registry(settings.hosts_file)
    except RegistryError as error:
        return CheckContext(
            settings, host, None, registry_problem=str(error).splitlines()[0], registry_readable=False
        )
    spec = next((h for h in registry.hosts if h.name == host), None)
    problem = "" if spec is not None else f"{settings.hosts_file} does not declare host {host}"
    return CheckContext(settings, host, spec, registry_problem=problem)


def _line(name: str, status: CheckStatus, detail: str, fix: str = "") -> CheckLine:
    return CheckLine(name=name, status=status, detail=detail[:2000], fix=fix[:1000])


# --- the checks that need no Temporal --------------------------------------------------------------------------


def check_registry(ctx: CheckContext) -> CheckLine:
    if ctx.spec is not None:
        gpus = ctx.spec.gpus
        kind = "simulated" if gpus.simulated else gpus.model
        return _line(
            "registry", CheckStatus.OK, f"declared in {ctx.settings.hosts_file}: {gpus.count}x {kind}"
        )
    if not ctx.registry_readable:  # the worker reads the host's limits there: it would not start
        return _line("registry", CheckStatus.FAIL, ctx.registry_problem,
                     "point DAEDALUS_HOSTS_FILE at the pool's hosts.yaml (an installed bundle has no examples/)")  # fmt: skip
    return _line(
        "registry",
        CheckStatus.WARN,
        f"{ctx.registry_problem}: no GPUs, no limits of its own, no lease keeper for it",
        "declare the host in hosts.yaml and point DAEDALUS_HOSTS_FILE at it",
    )


def check_packages(_: CheckContext) -> CheckLine:
    """Daedalus's own requirements, by installed version; then the worker's modules, imported."""
    unmet = []
    try:
        requirements = importlib.metadata.requires("daedalus") or []
    except importlib.metadata.PackageNotFoundError:
        requirements = []  # a source tree on sys.path without an install: the imports below still tell
    from daedalus.hosts.bundle_install import NOT_AS_WHEEL, WORKER_MODULES

    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(requirement.name) in NOT_AS_WHEEL:
            continue
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            unmet.append(f"{requirement} (not installed)")
            continue
        try:
            accepted = requirement.specifier.contains(Version(installed), prereleases=True)
        except InvalidVersion:
            accepted = False
        if not accepted:
            unmet.append(f"{requirement} ({installed} installed)")
    failed = []
    for module in (*WORKER_MODULES, "daedalus.worker"):
        try:
            importlib.import_module(module)
        except Exception as error:
            failed.append(f"{module}: {type(error).__name__}: {error}")
    if unmet or failed:
        return _line(
            "packages",
            CheckStatus.FAIL,
            "; ".join([*(f"needs {u}" for u in unmet), *failed]),
            "install the bundle again (`daedalus host install`), built without these names in --skip; or "
            "`pip install` the versions named",
        )
    return _line("packages", CheckStatus.OK, f"{len(requirements)} requirements met; worker modules import")


def _namespaces(pid: str = "self") -> dict[str, str]:
    found = {}
    for name in NAMESPACES:
        with contextlib.suppress(OSError):
            found[name] = os.readlink(f"/proc/{pid}/ns/{name}")
    return found


USERNS_FIX = (
    "let unprivileged users create user namespaces: `sysctl -w kernel.unprivileged_userns_clone=1` (Debian), "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 24.04), or a larger "
    "user.max_user_namespaces; or run the worker as root"
)


def _sandbox_fix(stderr: str) -> str:
    if "namespace" in stderr or "uid map" in stderr or "Operation not permitted" in stderr:
        return USERNS_FIX
    return "run the sandbox by hand (`bwrap --unshare-all --ro-bind / / true`) and fix what it says"


def check_sandbox(_: CheckContext) -> CheckLine:
    """An agent's sandbox starts, and every namespace in it differs from the worker's."""
    from daedalus.sandbox import Sandbox, bwrap_binary

    try:
        binary = bwrap_binary()
    except SandboxError as error:
        return _line(
            "sandbox",
            CheckStatus.FAIL,
            str(error),
            "install bubblewrap, or the offline bundle (it carries it)",
        )
    script = "for n in " + " ".join(NAMESPACES) + '; do echo "$n $(readlink /proc/self/ns/$n)"; done'
    with tempfile.TemporaryDirectory(prefix="daedalus-check-") as tmp:
        sandbox = Sandbox.for_worktree(Path(tmp))
        done = subprocess.run(sandbox.argv(["/bin/sh", "-c", script]), env=sandbox.environment("host-check"),
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip()[-500:]
        return _line(
            "sandbox", CheckStatus.FAIL, f"{binary} could not start a sandbox: {why}", _sandbox_fix(why)
        )
    inside = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    outside = _namespaces()
    shared = [n for n in NAMESPACES if n in outside and inside.get(n) == outside[n]]
    missing = [n for n in shared if n in REQUIRED_NAMESPACES]
    if missing:
        return _line(
            "sandbox",
            CheckStatus.FAIL,
            f"{binary}: the sandbox shares the worker's {', '.join(missing)} namespace(s)",
            USERNS_FIX,
        )
    if shared:
        return _line(
            "sandbox",
            CheckStatus.WARN,
            f"{binary}: every namespace unshared but {', '.join(shared)} (this kernel cannot)",
        )
    return _line("sandbox", CheckStatus.OK, f"{binary}: {', '.join(NAMESPACES)} unshared")


def _run_in_step(
    ctx: CheckContext, command: list[str], devices: list[Path]
) -> subprocess.CompletedProcess[str]:
    """`command` as a build or gate runs it: Sandbox.for_step, the engine cache layered read-only."""
    from daedalus.sandbox import Sandbox

    with tempfile.TemporaryDirectory(prefix="daedalus-check-") as tmp:
        worktree = Path(tmp) / "worktree"
        worktree.mkdir()
        sandbox = Sandbox.for_step(worktree, objects=None, scratch=Path(tmp) / "scratch", cache=paths.cache_root(),
                                   read_only=ctx.settings.steps.read_only, devices=devices)  # fmt: skip
        return subprocess.run(sandbox.argv(command), env=sandbox.environment("host-check"), capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip


def check_steps(ctx: CheckContext) -> CheckLine:
    """A confined build or gate runs Daedalus's own code: its interpreter and every site directory it reads."""
    try:
        done = _run_in_step(ctx, [sys.executable, "-c", f"import {STEP_IMPORT}"], [])
    except SandboxError as error:
        return _line("steps", CheckStatus.SKIP, f"no sandbox: {error}")
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        return _line(
            "steps",
            CheckStatus.FAIL,
            f"a build's or gate's sandbox cannot import {STEP_IMPORT}: {why[-1] if why else done.returncode}",
            "the sandbox shows a step only Daedalus's installation and steps.read_only: add the directory the "
            'import needs to DAEDALUS_STEPS_READ_ONLY (a JSON list, e.g. ["/opt/torch/.venv"])',
        )
    return _line("steps", CheckStatus.OK, f"a build's or gate's sandbox imports {STEP_IMPORT}")


@dataclass(frozen=True)
class GpuReadings:
    smi: GpuReport | None
    nvml: GpuReport | None
    caps: dict[str, str]
    problem: str = ""


def read_gpus(nvml_module: object | None = None) -> GpuReadings:
    """nvidia-smi (XML and compute capabilities) and NVML, each as far as it answers."""
    smi = shutil.which("nvidia-smi")
    problems = []
    smi_report, caps = None, {}
    if smi is None:
        problems.append("nvidia-smi is not on PATH")
    else:
        xml = subprocess.run([smi, "-q", "-x"], capture_output=True, text=True, timeout=60, check=False)
        query = subprocess.run(
            [smi, *COMPUTE_CAP_QUERY], capture_output=True, text=True, timeout=60, check=False
        )
        try:
            smi_report = parse_nvidia_smi_xml(xml.stdout) if xml.returncode == 0 else None
            caps = parse_compute_caps(query.stdout) if query.returncode == 0 else {}
        except GpuReadError as error:
            problems.append(str(error))
        if xml.returncode != 0:
            problems.append(f"nvidia-smi -q -x failed (exit {xml.returncode}): {xml.stderr.strip()[-300:]}")
    nvml_report = None
    try:
        if nvml_module is None:
            import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py: the `gpu` extra

            nvml_module = pynvml
        nvml_report = read_nvml(nvml_module)  # type: ignore[arg-type]
    except Exception as error:  # ImportError, or pynvml's NVMLError family
        problems.append(f"NVML: {type(error).__name__}: {error}")
    return GpuReadings(smi_report, nvml_report, caps, "; ".join(problems))


def judge_gpus(ctx: CheckContext, readings: GpuReadings) -> list[CheckLine]:
    """The GPUs as the registry declares them, against what nvidia-smi and NVML read."""
    declared = ctx.real_gpus
    if declared == 0:
        return [_line("gpus", CheckStatus.SKIP, "no real GPUs declared for this host")]
    smi, nvml = readings.smi, readings.nvml
    if smi is None or nvml is None:
        return [
            _line(
                "gpus",
                CheckStatus.FAIL,
                f"{declared} GPU(s) declared, but they cannot be read: {readings.problem}",
                "install the NVIDIA driver's nvidia-smi and nvidia-ml-py (the `gpu` extra) on this host, or "
                "declare it without GPUs in hosts.yaml",
            )
        ]
    lines = []
    problems = disagreements(smi, nvml)
    if problems:
        lines.append(
            _line(
                "gpus",
                CheckStatus.FAIL,
                "nvidia-smi and NVML disagree: " + "; ".join(problems),
                "the driver and its NVML library differ (a driver updated without a reboot, or a container "
                "with another libnvidia-ml): reboot, or make the container's driver libraries match the host's",
            )
        )
    elif len(nvml.gpus) != declared:
        lines.append(
            _line(
                "gpus",
                CheckStatus.FAIL,
                f"hosts.yaml declares {declared} GPU(s); this host has {len(nvml.gpus)}",
                f"set gpus.count: {len(nvml.gpus)} for host {ctx.host} in hosts.yaml (leases hand out indices "
                "the registry declares)",
            )
        )
    else:
        names = ", ".join(sorted({g.name for g in nvml.gpus}))
        lines.append(
            _line(
                "gpus",
                CheckStatus.OK,
                f"{len(nvml.gpus)}x {names}, driver {nvml.driver}; nvidia-smi and NVML agree",
            )
        )
    caps = {g.index: g.compute_capability or readings.caps.get(g.uuid) for g in nvml.gpus}
    unknown = [i for i, cap in caps.items() if not cap]
    lines.append(
        _line(
            "compute-capability",
            CheckStatus.FAIL if unknown else CheckStatus.OK,
            f"GPUs {unknown}: no compute capability from NVML or nvidia-smi"
            if unknown
            else ", ".join(f"GPU {i}: {cap}" for i, cap in caps.items()),
            "a CUDA build needs the architectures: update the driver, or set cuda_architectures in the presets"
            if unknown
            else "",
        )
    )
    renumbered = [g for g in nvml.gpus if g.minor_number is not None and g.minor_number != g.index]
    if renumbered:
        lines.append(
            _line(
                "device-nodes",
                CheckStatus.FAIL,
                "a leased GPU's step sees /dev/nvidia<index>, but here "
                + ", ".join(f"GPU {g.index} is /dev/nvidia{g.minor_number}" for g in renumbered),
                "do not serve GPU work from this host until leases bind device nodes by minor number "
                "(daedalus.confinement.gpu_device_nodes)",
            )
        )
    free = []
    low = []
    for gpu in nvml.gpus:
        if gpu.memory_total_mib and gpu.memory_free_mib is not None:
            free.append(f"GPU {gpu.index}: {gpu.memory_free_mib:,} of {gpu.memory_total_mib:,} MiB free")
            if gpu.memory_free_mib < MIN_FREE_GPU_FRACTION * gpu.memory_total_mib:
                low.append(gpu.index)
        else:
            free.append(f"GPU {gpu.index}: memory not reported (unified memory: host MemAvailable counts)")
    lines.append(
        _line(
            "gpu-memory",
            CheckStatus.WARN if low else CheckStatus.OK,
            "; ".join(free) + (f"; GPUs {low} are more than half used by others" if low else ""),
            "find who holds them (`nvidia-smi`); declare a tenant in hosts.yaml if they are shared"
            if low
            else "",
        )
    )
    return lines


GPU_STEP_PROBE = """
import ctypes, json
found = {}
for name, library, init, count, counter in (
    ("cuda", "libcuda.so.1", "cuInit", "cuDeviceGetCount", ctypes.c_int),
    ("nvml", "libnvidia-ml.so.1", "nvmlInit_v2", "nvmlDeviceGetCount_v2", ctypes.c_uint),
):
    try:
        lib = ctypes.CDLL(library)
    except OSError as error:
        found[name] = {"error": str(error)}
        continue
    code = getattr(lib, init)(0) if name == "cuda" else getattr(lib, init)()
    n = counter(0)
    if code == 0:
        code = getattr(lib, count)(ctypes.byref(n))
    found[name] = {"code": code, "count": n.value}
print(json.dumps(found))
"""
"""What a gate on a leased GPU needs of the driver, asked from inside a step's sandbox: CUDA (llama-server,
torch) and NVML (the KiB/token and training readings), through the libraries' own C entry points."""

LINKER_FIX = (
    "the driver's libraries (libcuda.so.1, libnvidia-ml.so.1) are not in the linker cache, and a step does not "
    "inherit LD_LIBRARY_PATH: add their directory to /etc/ld.so.conf.d/ and run ldconfig"
)


def gpu_step_probe(ctx: CheckContext, nodes: list[Path]) -> dict[str, dict[str, object]]:
    """GPU_STEP_PROBE's answer from a step sandbox given `nodes`; {"sandbox": {"error": ...}} if it did not run."""
    import json

    done = _run_in_step(ctx, [sys.executable, "-c", GPU_STEP_PROBE], nodes)
    try:
        found: dict[str, dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {
            "sandbox": {"error": (done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}"}
        }
    return found


def check_gpus_in_steps(ctx: CheckContext) -> CheckLine:
    """A step leased every GPU reaches them all from its sandbox (their device nodes, the driver's libraries,
    CUDA and NVML), and nothing else of the host."""
    if ctx.real_gpus == 0:
        return _line("gpus-in-steps", CheckStatus.SKIP, "no real GPUs declared for this host")
    from daedalus.confinement import GPU_CONTROL_NODES, gpu_device_nodes

    nodes = gpu_device_nodes(list(range(ctx.real_gpus)))
    try:
        found = gpu_step_probe(ctx, nodes)
    except SandboxError as error:
        return _line("gpus-in-steps", CheckStatus.SKIP, f"no sandbox: {error}")
    shown = f"with {', '.join(str(n) for n in nodes) or 'no device nodes'}: {found}"
    errors = " ".join(str(part.get("error", "")) for part in found.values())
    if "sandbox" in found:
        return _line("gpus-in-steps", CheckStatus.FAIL, f"the probe did not run in a step's sandbox {shown}",
                     "run `daedalus host check` again; the sandbox line above says what broke")  # fmt: skip
    if "cannot open shared object" in errors or "No such file" in errors:
        return _line("gpus-in-steps", CheckStatus.FAIL, f"a step's sandbox {shown}", LINKER_FIX)
    missing = [name for name in GPU_CONTROL_NODES[:2] if not (Path("/dev") / name).exists()]
    ok = all(part.get("code") == 0 and part.get("count") == ctx.real_gpus for part in found.values())
    if not ok:
        fix = (
            f"create the driver's missing device nodes ({', '.join('/dev/' + m for m in missing)}): "
            "`nvidia-modprobe -u -c=0`, or run any CUDA program on the host once"
            if missing
            else "compare with the same probe outside the sandbox (`daedalus host check` shows the gpus line); "
            "CUDA error 100 means no device node was visible, 999 or 304 that the driver needs more of the host"
        )
        return _line("gpus-in-steps", CheckStatus.FAIL, f"a step's sandbox {shown}", fix)
    return _line("gpus-in-steps", CheckStatus.OK, f"a step leased every GPU, {shown}")


def check_engine(ctx: CheckContext, capabilities: list[str]) -> CheckLine:
    """The llama.cpp source, and the build this host's gates need, are in the engine cache."""
    from daedalus.engines.llama_build import CPU, BuildConfig, cached_build
    from daedalus.errors import EngineError

    source = paths.default_llama_source()
    gpu = ctx.real_gpus > 0
    archs = sorted({c.replace(".", "") for c in capabilities})
    config = BuildConfig("cuda", tuple(archs)) if gpu and archs else CPU
    status_missing = CheckStatus.FAIL if gpu else CheckStatus.WARN
    if not (source / "CMakeLists.txt").is_file():
        return _line(
            "engine",
            status_missing,
            f"no llama.cpp source at {source}",
            "unpack the llama.cpp source there (scripts/fetch_llama_cpp.sh where PyPI is reachable; "
            "bench/gpu.py stage on an offline host), or set DAEDALUS_CACHE_DIR to the cache that has it",
        )
    try:
        build = cached_build(source, config)
    except EngineError as error:
        return _line("engine", status_missing, str(error), "fix the source tree named, then build again")
    label = f"{config.backend} {' '.join(config.cuda_architectures)}".strip()
    if build is None:
        command = "daedalus engine build" + (
            f" --backend cuda {' '.join('--cuda-arch ' + a for a in archs)}"
            if config.backend == "cuda"
            else ""
        )
        return _line(
            "engine",
            status_missing,
            f"no {label} build of {source} in {paths.cache_root()}: every confined build and gate would build it "
            "again (minutes) and keep nothing",
            f"run `{command}` on this host",
        )
    return _line("engine", CheckStatus.OK, f"llama.cpp {label} build at {build.build_dir}")


def check_disk(ctx: CheckContext) -> list[CheckLine]:
    lines = []
    for name, where, need in (
        ("disk-cache", paths.cache_root(), MIN_FREE_CACHE_GIB),
        ("disk-home", ctx.settings.home, MIN_FREE_HOME_GIB),
    ):
        probe = where
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free / GIB
        if free < need:
            lines.append(
                _line(
                    name,
                    CheckStatus.FAIL,
                    f"{free:.1f} GiB free under {where}, {need:g} GiB needed",
                    f"free space there, or point {'DAEDALUS_CACHE_DIR' if name == 'disk-cache' else 'DAEDALUS_HOME'} "
                    "at a larger disk",
                )
            )
        else:
            lines.append(_line(name, CheckStatus.OK, f"{free:.0f} GiB free under {where}"))
    return lines


def local_checks(ctx: CheckContext, gpu_readings: GpuReadings | None = None) -> list[CheckLine]:
    """Every check that needs no Temporal, in the order `daedalus host check` prints them."""
    lines = [check_registry(ctx), check_packages(ctx), check_sandbox(ctx), check_steps(ctx)]
    readings = gpu_readings if gpu_readings is not None else (read_gpus() if ctx.real_gpus else None)
    capabilities: list[str] = []
    if readings is not None:
        lines += judge_gpus(ctx, readings)
        if readings.nvml is not None:
            capabilities = [g.compute_capability or readings.caps.get(g.uuid, "") for g in readings.nvml.gpus]
            capabilities = [c for c in capabilities if c]
        lines.append(check_gpus_in_steps(ctx))
    else:
        lines.append(_line("gpus", CheckStatus.SKIP, "no real GPUs declared for this host"))
    lines.append(check_engine(ctx, capabilities))
    lines += check_disk(ctx)
    return lines


# --- Temporal: reachable, and its clock ------------------------------------------------------------------------


async def check_temporal(settings: Settings, timeout_s: float = 15.0) -> tuple[CheckLine, object | None]:
    """Connect as the worker will (address, namespace, TLS, API key) and ask the server who it is."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, GetSystemInfoRequest
    from temporalio.service import RPCError

    from daedalus.services._temporal import connect

    temporal = settings.temporal
    where = f"Temporal at {temporal.target} (namespace {temporal.namespace})"
    try:
        security = temporal.connection()
    except BadSettings as error:
        return _line("temporal", CheckStatus.FAIL, str(error), "fix the setting it names"), None
    try:
        client = await asyncio.wait_for(connect(temporal.target, temporal.namespace, **security), timeout_s)
        info = await client.workflow_service.get_system_info(
            GetSystemInfoRequest(), timeout=timedelta(seconds=timeout_s)
        )
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=temporal.namespace), timeout=timedelta(seconds=timeout_s)
        )
    except TimeoutError:
        return _line(
            "temporal",
            CheckStatus.FAIL,
            f"{where} did not answer within {timeout_s:g}s",
            "check DAEDALUS_TEMPORAL_ADDRESS and that this host can reach it (firewall, VPN)",
        ), None
    except Exception as error:  # TicketError from connect, RPCError, TLS handshake errors
        text = getattr(error, "message", None) or str(error)
        lowered = text.lower()
        if "tls" in lowered or "certificate" in lowered or "handshake" in lowered or "ssl" in lowered:
            fix = "check DAEDALUS_TEMPORAL_TLS, _TLS_SERVER_CA, _TLS_CLIENT_CERT/_KEY and _TLS_SERVER_NAME"
        elif isinstance(error, RPCError) and error.status.name in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            fix = (
                "check DAEDALUS_TEMPORAL_API_KEY (or the mTLS client certificate) and the namespace's access"
            )
        elif isinstance(error, RPCError) and error.status.name == "NOT_FOUND":
            fix = f"create namespace {temporal.namespace}, or set DAEDALUS_TEMPORAL_NAMESPACE"
        else:
            fix = (
                "start Temporal (`daedalus up` on the control host) or point DAEDALUS_TEMPORAL_ADDRESS at it"
            )
        return _line("temporal", CheckStatus.FAIL, f"{where}: {text[-400:]}", fix), None
    version = getattr(info, "server_version", "") or "?"
    security_note = "TLS" if security.get("tls") else "plain"
    if security.get("api_key"):
        security_note += " + API key"
    return _line("temporal", CheckStatus.OK, f"{where} answers (server {version}, {security_note})"), client


def judge_clock(sent: datetime, received: datetime, server: datetime) -> CheckLine:
    """This host's clock minus Temporal's lies in [sent - server, received - server] (the server read its clock
    between our send and our receipt); judged against MAX_CLOCK_SKEW_S only where that whole interval is."""
    low = (sent - server).total_seconds()
    high = (received - server).total_seconds()
    span = f"this host's clock minus Temporal's: {low:+.3f} .. {high:+.3f} s"
    if low > MAX_CLOCK_SKEW_S or high < -MAX_CLOCK_SKEW_S:
        return _line(
            "clock",
            CheckStatus.FAIL,
            f"{span}, beyond ±{MAX_CLOCK_SKEW_S:g} s",
            "synchronise the clock (`timedatectl set-ntp true`, or chrony/ntpd) and start the worker again",
        )
    if low >= -MAX_CLOCK_SKEW_S and high <= MAX_CLOCK_SKEW_S:
        return _line("clock", CheckStatus.OK, span)
    return _line(
        "clock",
        CheckStatus.WARN,
        f"{span}: the round trip is too slow to say whether it is within ±{MAX_CLOCK_SKEW_S:g} s",
    )


def identity() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"


async def record(
    client: object, check: HostCheck, timeout_s: float = 15.0
) -> tuple[HostCheckReceipt, datetime, datetime]:
    """Send the check to the host's lease keeper; returns its receipt and our clock before and after."""
    from temporalio.client import Client

    from daedalus.hosts.holder import RECORD_HOST_CHECK
    from daedalus.hosts.leases import keeper_id

    assert isinstance(client, Client)
    handle = client.get_workflow_handle(keeper_id(check.host))
    sent = datetime.now(UTC)
    receipt: HostCheckReceipt = await asyncio.wait_for(
        handle.execute_update(RECORD_HOST_CHECK, check, result_type=HostCheckReceipt), timeout_s
    )
    return receipt, sent, datetime.now(UTC)


async def check_host(
    settings: Settings,
    host: str,
    *,
    send: bool = True,
    gpu_readings: GpuReadings | None = None,
) -> HostCheck:
    """Every check, then (with `send`) the check recorded at the host's lease keeper and the clock read there."""
    ctx = context(settings, host)
    lines = await asyncio.to_thread(local_checks, ctx, gpu_readings)
    temporal, client = await check_temporal(settings)
    lines.append(temporal)
    check = HostCheck(host=host, checked_at=datetime.now(UTC), checked_by=identity(), lines=lines)
    if client is None or not send:
        clock = _line(
            "clock",
            CheckStatus.SKIP,
            "not checked: " + ("Temporal unreachable" if client is None else "not sent"),
        )
        return HostCheck(
            host=host, checked_at=check.checked_at, checked_by=check.checked_by, lines=[*lines, clock]
        )
    try:
        receipt, sent, received = await record(client, check)
    except Exception as error:  # no keeper (host not in the control worker's registry), no control worker
        text = getattr(error, "message", None) or str(error) or type(error).__name__
        clock = _line(
            "clock",
            CheckStatus.WARN,
            f"not checked, and this check not kept: the lease keeper of {host} did not answer ({text[-300:]})",
            "start the control worker (`daedalus worker --control`) with a hosts.yaml that declares this host",
        )
        return HostCheck(
            host=host, checked_at=check.checked_at, checked_by=check.checked_by, lines=[*lines, clock]
        )
    clock = judge_clock(sent, received, receipt.received_at)
    final = HostCheck(
        host=host, checked_at=check.checked_at, checked_by=check.checked_by, lines=[*lines, clock]
    )
    with contextlib.suppress(Exception):
        await record(client, final)  # the kept check carries its clock line too
    return final
