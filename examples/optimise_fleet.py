"""Optimise a small heterogeneous fleet's per-robot send probability and transmit power.

Gradient descent through the committed calibrated QAD model (relaxed sends) and through a neural
proxy fitted here for this fleet, against CMA-ES running on the packet level (L2-legacy) and the
best uniform policy; every solution is scored on L2-legacy with held-out sends. Tiny sizes: under
a minute on 2 cores.

    python examples/optimise_fleet.py [--cells 4] [--robots 8] [--wall-s 8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from isaac_net import optimise as opt
from isaac_net.core.diff.calibrate import Calibration

REPO = Path(__file__).resolve().parents[1]
CALIBRATION = REPO / "benchmarks" / "diff" / "results" / "full" / "calibration.json"


def main(cells: int = 4, robots: int = 8, steps: int = 30, wall_s: float = 8.0, iters: int = 40,
         seed: int = 0, n_boot: int = 500) -> list[dict]:
    """Run the comparison and print its table; returns :func:`isaac_net.optimise.summarise`'s rows."""
    torch.set_num_threads(1)
    fleet = opt.make_fleet(cells, robots, steps, seed=seed)
    cal = Calibration.load(CALIBRATION, mode="QA", sends="relaxed")
    results = opt.optimise_fleet(fleet, calibration=cal, methods=("uniform", "gradient", "proxy", "cmaes"),
                                 budget=opt.Budget(wall_s=wall_s), T_eval=steps, warmup_eval=steps // 6,
                                 gradient_kwargs={"iters": iters, "T": 20, "warmup": 4, "score_every": 10},
                                 proxy_kwargs={"robots": 1024, "T": steps, "warmup": steps // 6,
                                               "epochs": 100},
                                 seed=seed)
    rows = opt.summarise(results, "uniform policy", n_boot=n_boot, seed=seed)
    print(f"{cells} cells x {robots} robots, {steps} steps, held-out cost on L2-legacy (lower is better)")
    print(f"{'method':<36} {'cost':>7} {'vs uniform [95% CI]':>26} {'better':>7} {'wall s':>7} "
          f"{'rollouts':>9}")
    for r in rows:
        ci = f"{r['diff']:+.3f} [{r['diff_lo']:+.3f}, {r['diff_hi']:+.3f}]"
        print(f"{r['method']:<36} {r['cost']:7.3f} {ci:>26} {r['better_cells']:7.0%} {r['wall_s']:7.1f} "
              f"{r['rollouts']:9d}")
    fit = results["gradient, neural proxy"].info["fit"]
    print(f"(the proxy's own fit: {fit['rollouts']} cell-rollouts of L2-legacy and {fit['wall_s']:.1f} s, "
          "paid once per cell configuration, as a calibration)")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=4)
    ap.add_argument("--robots", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--wall-s", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    main(a.cells, a.robots, a.steps, a.wall_s, seed=a.seed)
