# Set-up is part of every entry point: a fresh machine needs only Python >= 3.11 and pip.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CORES ?= all
# Pin torch first: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is a CPU wheel here.
TORCH ?= torch==2.13.0

.PHONY: setup test restore report pipeline smoke ci bench gpu-check lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

# One worker per core (pytest-xdist); the tests of one mode's compiled graphs share a worker.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadgroup

# Committed artifacts whose recorded input hashes match the checkout are marked up to date for
# Snakemake (file times and metadata; git keeps neither), so only what changed reruns.
restore: $(STAMP)
	$(BIN)/python workflow/scripts/restore.py

# The main job: the pipeline on its default (full) profile; renders reports/checks_and_measurements.md.
report pipeline: restore
	$(BIN)/snakemake --cores $(CORES) report

smoke: $(STAMP)
	$(BIN)/python workflow/scripts/restore.py --configfile config/smoke.yaml
	$(BIN)/snakemake --cores $(CORES) report --configfile config/smoke.yaml

bench: $(STAMP)
	$(BIN)/python -m pytest benchmarks/perf --benchmark-only --benchmark-json=benchmarks/perf/results/latest.json -q

# On a GPU machine, with its own python3 (a CUDA build of torch): the CUDA tests and the page's CUDA rows,
# into $(OUT) (commit its gpu_check.json and cuda_tests.txt as benchmarks/perf/results/gpu_check.json and
# gpu_cuda_tests.txt: docs/usage.md).
gpu-check:
	OUT=$${OUT:-gpu_out} bash benchmarks/perf/gpu_check.sh

lint: $(STAMP)
	$(BIN)/ruff check isaac_net tests benchmarks reports workflow/scripts
	$(BIN)/snakefmt --check Snakefile workflow/rules/
	$(BIN)/snakemake --lint

ci:
	bash .ci/run

clean:
	rm -rf $(VENV) .snakemake .pytest_cache
