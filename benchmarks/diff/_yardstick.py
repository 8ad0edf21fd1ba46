"""The box's yardstick: a fixed chain of small torch ops, timed on one thread, that depends on
torch alone (no library code and no other module of the stages), so that the cost stage and
``benchmarks/perf/l2_anchor.py`` time it in any checkout, earlier commits' included."""

import math
import time

import torch


def yardstick_s(repeats: int, steps: int = 10000) -> float:
    """A box's speed, independent of the library's code: the best of ``repeats`` passes of a fixed
    chain of ``steps`` small torch ops (``[16, 8, 10]``: the stages' kind of work, per-op overhead more
    than arithmetic), forward and backward, on one thread, s. Its ratio between two runs compares
    their boxes where the library's own timings also move with the code."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: expected a positive int, got {repeats!r}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x0 = torch.rand(16, 8, 10, generator=torch.Generator().manual_seed(0))
        best = math.inf
        for _ in range(repeats):
            x = x0.clone().requires_grad_()
            t0 = time.perf_counter()
            y = x
            for _ in range(steps):
                y = torch.sigmoid(y * 1.01 - 0.2).cumsum(-1) * 0.1
            y.sum().backward()
            best = min(best, time.perf_counter() - t0)
        return best
    finally:
        torch.set_num_threads(threads)
