#!/usr/bin/env bash
# The device check of the "Speed and scale" issue, as one prepared run on a GPU machine:
# the CUDA tests (every level and DiffFluid in float32 against the CPU, backend "cuda_graph"
# against eager), then the benchmark table on the GPU. Results go to $OUT (default ./gpu_out).
# Needs a Python with torch (CUDA build), pytest and pytest-benchmark; run from the repo root.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" | tee "$OUT/device.txt"
python3 -m pytest -q -m cuda tests -p no:cacheprovider 2>&1 | tee "$OUT/cuda_tests.txt"
tests_rc=${PIPESTATUS[0]}
ISAAC_BENCH_DEVICE=cuda python3 -m pytest -q benchmarks/perf --benchmark-only -p no:cacheprovider \
    --benchmark-json="$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench_cuda.txt"
exit $(( tests_rc || PIPESTATUS[0] ))
