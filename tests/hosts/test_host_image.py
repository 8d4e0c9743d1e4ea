"""A GPU host's image, simulated: a virtualenv holding exactly what the image holds of Daedalus's dependencies
(the packages `--skip h200` leaves out), no bubblewrap on PATH, nothing of Daedalus. The bundle is installed
there with no index by `bench/gpu.py`'s first phase under that image's bare interpreter (`-I -S`: no site
packages at all), the host checks itself, and a ticket runs whose agent runs in the bundle's bubblewrap.

This is the path the lent H200 takes (bench/gpu.py stage/run), on this machine's Python and CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daedalus.devserver import DevServer
from daedalus.engines.paths import cache_root
from daedalus.hosts.bundle import BundleTarget, build_bundle
from daedalus.ports import free_port
from tests.support import EMIT, FIXTURES, SPEED_PATCH, make_engine_repo

REPO = Path(__file__).resolve().parents[2]
THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"

DRIVER = """
import asyncio, json, os, sys
from pathlib import Path
from daedalus import services as tickets
from daedalus.config import Settings
from daedalus.devserver import temporal_binary
from daedalus.sandbox import bwrap_binary
from daedalus.stack import running_stack

async def main() -> None:
    spec = tickets.parse_spec(json.loads(Path(sys.argv[1]).read_text()), "bundle test")
    settings = Settings.load()
    async with running_stack(settings, hosts=[spec.host], embedded=True) as stack:
        handle = await tickets.file_ticket(stack.client, spec, queue=settings.temporal.control_queue, filed_by="test")
        state = await asyncio.wait_for(handle.result(), 240)
    print(json.dumps({"status": state.status.value, "temporal": str(temporal_binary()), "bwrap": bwrap_binary(),
                      "verdicts": [g.verdict.value for a in state.attempts for g in a.gate_results],
                      "attempts": [a.detail for a in state.attempts]}))

asyncio.run(main())
sys.stdout.flush()
os._exit(0)
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The bundle for this Python with `--skip h200`, and the image: a venv of exactly what that skipped."""
    root = tmp_path_factory.mktemp("image")
    bundle = root / "bundle"
    manifest = build_bundle(
        bundle, target=BundleTarget(python=THIS_PYTHON), skip=["h200"], max_mib=None, cache=cache_root()
    )
    base = getattr(sys, "_base_executable", sys.executable)
    venv = root / "image"
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    skipped = list(manifest["skipped_present_on_target"])  # type: ignore[call-overload]
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", *skipped],
                   check=True, capture_output=True)  # fmt: skip
    # The host's tools, without bubblewrap: every program of /usr/bin but bwrap.
    tools = root / "usr-bin"
    tools.mkdir()
    for program in Path("/usr/bin").iterdir():
        if program.name != "bwrap":
            (tools / program.name).symlink_to(program)
    assert shutil.which("bwrap", path=str(tools)) is None
    yield {"bundle": bundle, "python": venv / "bin" / "python", "tools": tools, "root": root}


@pytest.mark.timeout(1800)
def test_the_bundle_installs_on_a_bare_image_and_runs_a_ticket_in_its_own_bubblewrap(
    image: dict[str, Path], temporal_server: DevServer, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    env = {"PATH": str(image["tools"]), "HOME": os.environ.get("HOME", str(tmp_path)),
           "DAEDALUS_CACHE_DIR": str(work / "engine-cache")}  # fmt: skip
    # Phase 1 under the image's interpreter with no site packages: the standard library alone installs the bundle;
    # phase 2, in the venv, reports what it runs with.
    done = subprocess.run([str(image["python"]), "-I", "-S", str(REPO / "bench" / "gpu.py"), "stage", "--install-only",
                           "--bundle", str(image["bundle"]), "--work", str(work)],
                          env=env, capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    venv = work / "venv"
    installed = json.loads(done.stdout.strip().splitlines()[-1])
    assert installed["python"] == str(venv / "bin" / "python")
    assert installed["cache_root"] == str(work / "engine-cache")  # DAEDALUS_CACHE_DIR reached the engine code
    assert installed["llama_source"].startswith(str(work / "engine-cache") + "/src/")
    assert installed["bwrap"] == str(venv / "bin" / "bwrap")  # the host has none: the bundle's
    assert installed["daedalus"].startswith(str(venv))

    hosts_file = tmp_path / "hosts.yaml"  # an installed bundle has no examples/: the pool's registry is given
    hosts_file.write_text("hosts:\n  - name: offline\n    gpus: {count: 0}\n")
    host_env = {**env, "PATH": f"{venv / 'bin'}:{image['tools']}", "DAEDALUS_HOME": str(tmp_path / "home"),
                "DAEDALUS_HOSTS_FILE": str(hosts_file),
                "DAEDALUS_TEMPORAL_ADDRESS": temporal_server.address,
                "DAEDALUS_STEPS_READ_ONLY": json.dumps([str(FIXTURES)])}  # fmt: skip
    checked = subprocess.run([str(venv / "bin" / "daedalus"), "host", "check", "--host", "offline", "--no-send",
                              "--json"], env=host_env, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    check = json.loads(checked.stdout)
    lines = {line["name"]: line for line in check["lines"]}
    assert checked.returncode == 0, lines
    assert {
        n: lines[n]["status"] for n in ("registry", "packages", "sandbox", "steps", "temporal")
    } == dict.fromkeys(("registry", "packages", "sandbox", "steps", "temporal"), "ok")
    unset = {k: v for k, v in host_env.items() if k != "DAEDALUS_HOSTS_FILE"}
    without = subprocess.run([str(venv / "bin" / "daedalus"), "host", "check", "--host", "offline", "--no-send",
                              "--json"], env=unset, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    registry = next(line for line in json.loads(without.stdout)["lines"] if line["name"] == "registry")
    assert (
        without.returncode == 1 and registry["status"] == "fail" and "DAEDALUS_HOSTS_FILE" in registry["fix"]
    )
    assert lines["sandbox"]["detail"].startswith(str(venv / "bin" / "bwrap"))

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
    run_env = {**host_env, "DAEDALUS_TEMPORAL_PORT": str(free_port()), "DAEDALUS_UI_PORT": str(free_port())}
    del run_env["DAEDALUS_TEMPORAL_ADDRESS"]
    ran = subprocess.run([str(venv / "bin" / "python"), str(tmp_path / "driver.py"), str(tmp_path / "spec.json")],
                         cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["status"] == "passed", result
    assert result["bwrap"] == str(venv / "bin" / "bwrap") and result["temporal"] == str(
        venv / "bin" / "temporal"
    )
    assert result["verdicts"] == ["PASS"]
