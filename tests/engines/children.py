"""The llama-servers a command started: those serving a model, not the short `llama-server --help` that reads a
build's KV cache types (which a test polling for the server would otherwise catch, without the server's env)."""

from __future__ import annotations

import psutil


def serving_llama_servers(pid: int) -> list[psutil.Process]:
    servers = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.name().startswith("llama-server") and "--model" in child.cmdline():
                servers.append(child)
        except psutil.NoSuchProcess:
            continue
    return servers
