"""`daedalus engine bench` stopped with SIGTERM stops the llama-server it launched (it used to run on)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from tests.engines.children import serving_llama_servers

from daedalus.engines.llama_build import LlamaBuild

DAEDALUS = str(Path(sys.executable).parent / "daedalus")


def test_a_stopped_engine_bench_stops_its_server(llama_build: LlamaBuild, tiny_model: Path) -> None:
    command = subprocess.Popen(
        [DAEDALUS, "engine", "bench", "--preset", "local-f16", "--model", str(tiny_model), "--rounds", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (servers := serving_llama_servers(command.pid)):
            assert command.poll() is None, command.communicate()
            assert time.monotonic() < deadline, "no llama-server started"
            time.sleep(0.2)
        command.send_signal(signal.SIGTERM)
        _, stderr = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
    assert command.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped by SIGTERM" in stderr
    _, alive = psutil.wait_procs(servers, timeout=10)
    assert not alive, f"llama-server outlived the command: {alive}"
