"""Benchmark: one L2-legacy rollout at E = 64, R = 8, T = 200 on one CPU thread.

Run with ``OMP_NUM_THREADS=1 pytest benchmarks/perf/test_bench_l2.py --benchmark-only``.
The target is at most 20 s per rollout (recorded in ``extra_info``; a benchmark, not a
timed unit test, so nothing fails on a slow or loaded machine).
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from isaac_net.core import make_engine

E, R, T = 64, 8, 200
TARGET_S = 20.0
DEVICE = os.environ.get("ISAAC_BENCH_DEVICE", "cpu")  # as in test_bench_diff.py


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    send = (torch.rand(T, E, R, generator=g) < 0.4).float()
    msg_bytes = torch.where(torch.rand(E, R, generator=g) < 0.5, 4000.0, 30_000.0)
    pos = 40.0 + 100.0 * torch.rand(E, R, 2, generator=g)
    return send.to(DEVICE), msg_bytes.to(DEVICE), pos.to(DEVICE)


def _rollout(send, msg_bytes, pos):
    eng = make_engine("L2-legacy", E, R, DEVICE, seed=0)
    total = {}
    for t in range(T):
        out = eng.step(send[t], msg_bytes, pos=pos)
        for k, v in out.items():
            total[k] = total.get(k, 0.0) + v
    if DEVICE != "cpu":
        torch.cuda.synchronize()
    return total, out["queued_msgs"]


@pytest.mark.benchmark(group="l2-legacy", min_rounds=1)
def test_bench_l2_legacy_rollout(benchmark):
    torch.set_num_threads(1)
    send, msg_bytes, pos = _inputs()
    cpu0 = time.process_time()
    total, queued = benchmark.pedantic(_rollout, args=(send, msg_bytes, pos), rounds=1, iterations=1)
    benchmark.extra_info.update(
        E=E, R=R, T=T, device=DEVICE, target_s=TARGET_S, torch_threads=torch.get_num_threads(),
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"), cpu_s=time.process_time() - cpu0,
        load_avg_1min=os.getloadavg()[0], torch=torch.__version__,
    )
    # The run did real work and kept its books.
    assert float(total["delivered"].sum()) > 0
    rest = total["delivered"] + total["timeouts"] + total["overflow"] + queued
    torch.testing.assert_close(total["offered"], rest)
