"""A vLLM ticket's engine repo, installed over the engine environment at the attempt's commit: the gates measure the
agent's change, never whatever vLLM the host has installed.

Teams carry Python-only changes to vLLM two ways, and a repo may hold either:

* **plugins**: a Python package whose `pyproject.toml` (or `setup.py`) registers an entry point in
  `vllm.general_plugins` (vLLM calls each in every process it starts: API server, engine core, workers). It is
  installed with the engine environment's own pip (`--no-deps --no-index --no-build-isolation`: no network) into
  the overlay's site directory;
* **a fork's Python tree**: a `vllm/` package at the repo's root. The overlay's `vllm/` is the installed package
  with the fork's files over it: every file of the installed package is linked (its compiled extensions, which a
  Python-only fork does not build, and its bytecode caches), then every file of the fork's tree replaces its link.
  With `strict` (the seed's 6b "strict pure-repo boot") no Python file of the installed package is linked: every
  module vLLM imports must come from the repo, so a file that exists only in site-packages fails the boot.

`daedalus engine overlay` (a vLLM ticket's `build:`) writes the overlay into the checkout it runs in,
`<checkout>/.daedalus-engine/`, and its stamp last. The build runs confined, so the overlay can only live in the
attempt's checkout (or the step's scratch): the shared engine cache is read-only to it and never changes. A gate's
`daedalus engine measure` runs in the same checkout: a preset that names the environment the overlay was built over
then launches vLLM with the overlay's site directory ahead of the environment's (PYTHONPATH), and its provenance
names the overlay and its commit. An overlay built at another commit than the checkout's HEAD is refused (what the
agent committed as `.daedalus-engine/` is never used: the build removes it, and its stamp cannot name its own
commit).
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
from pathlib import Path
from typing import TypedDict

from pydantic import BaseModel, Field, ValidationError

from daedalus.engines.vllm_env import SERVER_MODULE, VllmEnvironment
from daedalus.errors import EngineSetupError

OVERLAY_DIR = ".daedalus-engine"
STAMP = "overlay.json"
PLUGIN_GROUP = "vllm.general_plugins"
_PACKAGING = ("pyproject.toml", "setup.py")
# Run by the overlay's python with the overlay on its path: what vLLM will import, and which plugins it will find.
_STRICT_BOOT = f"import {SERVER_MODULE};"
"""What a strict overlay must import from the repo's tree alone: vLLM's OpenAI server and all it pulls in."""
_INSPECT = (
    "import importlib.metadata as m, json, vllm;"
    "print(json.dumps({'vllm': vllm.__file__, 'plugins': sorted("
    f"[e.name, str(e.dist.locate_file('')) if e.dist else ''] for e in m.entry_points(group='{PLUGIN_GROUP}'))}}))"
)


class OverlayStamp(BaseModel):
    """Written last into a complete overlay: what it holds and the commit it was built at."""

    commit: str
    environment: str = Field(description="the engine environment's root the overlay is laid over")
    site: str
    plugins: list[str] = Field(
        default_factory=list, description="vllm.general_plugins entry points it provides"
    )
    fork_files: int = Field(
        default=0, description="files of the repo's vllm/ tree laid over the installed package"
    )
    strict: bool = False
    vllm_file: str = Field(
        default="", description="where `import vllm` resolves with the overlay on the path"
    )
    built_at: str


class Overlay:
    """A built overlay in a checkout, checked against the checkout's HEAD."""

    def __init__(self, checkout: Path, stamp: OverlayStamp) -> None:
        self.checkout = checkout
        self.stamp = stamp

    @property
    def site(self) -> Path:
        return Path(self.stamp.site)

    def environment(self) -> dict[str, str]:
        """What the server's process needs: the overlay's site directory first on its path."""
        return {"PYTHONPATH": str(self.site)}

    def describe(self) -> str:
        parts = []
        if self.stamp.fork_files:
            parts.append(f"{self.stamp.fork_files} fork files{' (strict)' if self.stamp.strict else ''}")
        if self.stamp.plugins:
            parts.append(f"plugins {', '.join(self.stamp.plugins)}")
        held = "; ".join(parts) or "nothing to install"
        return f"overlay of {self.checkout} at {self.stamp.commit[:12]} ({held})"


def overlay_dir(checkout: Path) -> Path:
    return checkout / OVERLAY_DIR


def head_commit(checkout: Path) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise EngineSetupError(
            f"{checkout} is not a git checkout with a commit (git rev-parse HEAD: {done.stderr.strip()}); an "
            "overlay is built from an engine repo at a commit"
        )
    return done.stdout.strip()


def find_overlay(checkout: Path) -> Overlay | None:
    """The overlay built in `checkout`, or None when there is none. One built at another commit, or left half
    written, is an error that says to run the build again."""
    directory = overlay_dir(checkout)
    if not directory.exists():
        return None
    try:
        stamp = OverlayStamp.model_validate_json((directory / STAMP).read_text())
    except (OSError, ValidationError) as error:
        raise EngineSetupError(
            f"{directory} holds no complete engine overlay ({type(error).__name__}); run the ticket's build "
            "(`daedalus engine overlay`) again"
        ) from None
    head = head_commit(checkout)
    if stamp.commit != head:
        raise EngineSetupError(
            f"the engine overlay in {directory} was built at {stamp.commit[:12]}, the checkout is at {head[:12]}: "
            "run the ticket's build (`daedalus engine overlay`) at this commit"
        )
    if Path(stamp.site).resolve().parent != directory.resolve():
        raise EngineSetupError(
            f"the engine overlay's site {stamp.site} is not inside {directory}; build it again"
        )
    return Overlay(checkout.resolve(), stamp)


def build_overlay(checkout: Path, environment: VllmEnvironment, *, strict: bool = False) -> Overlay:
    """Install the engine repo at `checkout` (its HEAD) over `environment` into `<checkout>/.daedalus-engine/`."""
    checkout = checkout.resolve()
    commit = head_commit(checkout)
    directory = overlay_dir(checkout)
    shutil.rmtree(directory, ignore_errors=True)  # whatever is there (the agent's commit may hold one) goes
    site = directory / "site"
    site.mkdir(parents=True)
    fork = checkout / "vllm" / "__init__.py"
    fork_files = 0
    if fork.is_file():
        fork_files = _lay_fork_tree(
            checkout / "vllm", _installed_vllm(environment), site / "vllm", strict=strict
        )
    elif strict:
        raise EngineSetupError(
            f"a strict overlay boots vLLM from the repo's own Python tree, and {checkout} has no vllm/__init__.py"
        )
    elif any((checkout / name).is_file() for name in _PACKAGING):
        _pip_install(environment, checkout, site, directory / "pip.log")
    # Nothing installed (a repo of presets only): vLLM is the environment's, as it is without the overlay.
    installs = fork_files or any(site.iterdir())
    seen = (
        _inspect(environment, site, strict=strict)
        if installs
        else _Seen(vllm=str(_installed_vllm(environment) / "__init__.py"), plugins=[])
    )
    if fork_files and not Path(seen["vllm"]).is_relative_to(site):
        raise EngineSetupError(f"with the overlay on the path `import vllm` still resolves to {seen['vllm']}")
    stamp = OverlayStamp(
        commit=commit,
        environment=str(environment.root),
        site=str(site),
        plugins=list(seen["plugins"]),
        fork_files=fork_files,
        strict=strict,
        vllm_file=seen["vllm"],
        built_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    partial = directory / f"{STAMP}.partial"
    partial.write_text(stamp.model_dump_json(indent=2) + "\n")
    partial.rename(directory / STAMP)
    return Overlay(checkout, stamp)


def _installed_vllm(environment: VllmEnvironment) -> Path:
    found = sorted(environment.root.glob("lib/python*/site-packages/vllm/__init__.py"))
    if not found:
        raise EngineSetupError(f"no vllm package is installed in the environment {environment.root}")
    return found[0].parent


def _lay_fork_tree(fork: Path, installed: Path, target: Path, *, strict: bool) -> int:
    """The installed package linked file by file (bytecode caches as whole directories), then the fork's files
    copied over their links. Strict: no installed Python source is linked, only what a Python-only fork cannot
    hold (compiled extensions, data files)."""
    for root, dirs, files in os.walk(installed):
        here = Path(root)
        out = target / here.relative_to(installed)
        out.mkdir(parents=True, exist_ok=True)
        if "__pycache__" in dirs:
            dirs.remove("__pycache__")
            if not strict:
                (out / "__pycache__").symlink_to(here / "__pycache__", target_is_directory=True)
        for name in files:
            if strict and name.endswith(".py"):
                continue
            (out / name).symlink_to(here / name)
    count = 0
    for root, dirs, files in os.walk(fork):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        here = Path(root)
        out = target / here.relative_to(fork)
        if out.is_symlink():
            out.unlink()
        out.mkdir(parents=True, exist_ok=True)
        cache = out / "__pycache__"
        if cache.is_symlink():  # the fork's modules compile here, never into the shared environment's cache
            cache.unlink()
        for name in files:
            destination = out / name
            if destination.is_symlink() or destination.exists():
                destination.unlink()
            shutil.copy2(here / name, destination)
            count += 1
    return count


def _pip_install(environment: VllmEnvironment, checkout: Path, site: Path, log: Path) -> None:
    argv = [str(environment.python), "-m", "pip", "install", "--no-deps", "--no-index", "--no-build-isolation",
            "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--target", str(site), str(checkout)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    log.write_text(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
        raise EngineSetupError(
            f"installing {checkout} into the overlay failed (exit {done.returncode}); {log}:\n{tail}"
        )


class _Seen(TypedDict):
    vllm: str
    plugins: list[str]


def _inspect(environment: VllmEnvironment, site: Path, *, strict: bool) -> _Seen:
    """What vLLM resolves to with the overlay first on its path; strict: its server module must import from the
    repo's own tree (the seed's 6b boot: a module that exists only in site-packages fails it here)."""
    import json

    env = {**os.environ, "PYTHONPATH": str(site)}
    code = (_STRICT_BOOT if strict else "") + _INSPECT
    done = subprocess.run([str(environment.python), "-c", code], capture_output=True, text=True, env=env,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-12:])
        what = (
            f"{SERVER_MODULE} does not import from the repo's tree alone"
            if strict
            else "vLLM does not import"
        )
        raise EngineSetupError(f"{what} with the overlay on its path (exit {done.returncode}):\n{tail}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # Only the plugins the overlay brings: the environment's own (vLLM ships some) are not the repo's change.
    mine = [
        name
        for name, where in found["plugins"]
        if where and Path(where).resolve().is_relative_to(site.resolve())
    ]
    return _Seen(vllm=str(found["vllm"]), plugins=mine)
