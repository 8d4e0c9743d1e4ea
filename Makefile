# The README's two commands. Each bootstraps .venv and the engine itself, so both work on a fresh clone.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test engine system lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# Debian packages: bubblewrap (the agent sandbox) and chromium (browser tests of the report and API docs).
system:
	@scripts/install_system_packages.sh

# llama.cpp source from PyPI (an install step), then the CMake build (cached by source hash; minutes, once).
engine: $(STAMP) system
	@scripts/fetch_llama_cpp.sh >/dev/null
	@echo "llama.cpp build (cached after the first time):" && $(VENV)/bin/daedalus engine build

demo: engine
	$(VENV)/bin/daedalus demo

test: engine
	$(VENV)/bin/python -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy

bench: engine
	$(VENV)/bin/python bench/lifecycle.py
	$(VENV)/bin/python bench/harness_fidelity.py
	$(VENV)/bin/python bench/dispatch.py
	$(VENV)/bin/python bench/watchdog.py
	$(VENV)/bin/python bench/chaos.py --store sqlite
	$(VENV)/bin/python bench/chaos.py --store postgres

clean:
	rm -rf .daedalus
