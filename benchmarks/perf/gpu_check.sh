#!/usr/bin/env bash
# The device check, as one prepared run on a GPU machine (the issues' "CUDA" items): the CUDA tests
# (every level and DiffFluid in float32 against the CPU, L2-legacy's events against the CPU's from the
# same draws, backend "cuda_graph" against eager), then the page's CUDA rows
# (benchmarks/perf/gpu_rows.py: L1, QA and L2-legacy eager and cuda_graph, L1D and QAD eager and
# compiled, E up to 16384). Results go to $OUT (default ./gpu_out): device.txt, cuda_tests.txt,
# gpu_rows.txt and gpu_check.json, which is committed as benchmarks/perf/results/gpu_check.json for
# the page (stage `gpu`). Needs a Python with torch (CUDA build), numba, scipy and pytest; run from
# the repository root. COMMIT names the commit measured where the copy has no .git.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" \
    | tee "$OUT/device.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$OUT/device.txt"
timeout "${TESTS_TIMEOUT_S:-240}" python3 -m pytest -q -k cuda -p no:cacheprovider \
    tests/test_levels.py tests/test_l2_legacy.py tests/test_diff.py tests/test_edge_cases.py 2>&1 \
    | tee "$OUT/cuda_tests.txt"
tests_rc=${PIPESTATUS[0]}
timeout "${ROWS_TIMEOUT_S:-330}" python3 benchmarks/perf/gpu_rows.py --out "$OUT/gpu_check.json" \
    --budget-s "${ROWS_BUDGET_S:-240}" ${COMMIT:+--commit "$COMMIT"} 2>&1 | tee "$OUT/gpu_rows.txt"
rows_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc rows rc=$rows_rc"
exit $(( tests_rc || rows_rc ))
