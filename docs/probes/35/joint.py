"""Probe (35): constants fitted jointly as a smooth form in log R over several fleet sizes at once,
against the committed per-size fits interpolated in log R (docs/design.md section 5, probe (35)).

Decision rule, set before any run: the form serves a size it was not fitted on better than
interpolation between neighbouring fits if its leave-one-size-out training loss (fitted on the
other four sizes, evaluated on the left-out size's training points) summed over R = 8, 16, 32 is
lower than the committed ``between`` loss summed there. Only training points and training targets
are read; no held-out size or point.

The form: the capacity factor (log) and the SNR offset as lines in log R (four numbers), fitted by
Nelder-Mead on the sum of the sizes' training losses, started at the least-squares line through
the fits' own constants; every other constant (latency floor, temperature, headroom requirement,
time on air's factor and exponent, spread) as the committed interpolation between the fitted
sizes (``FleetCalibration.at``), so at a fitted size its own fit's.

With ``DEG=2`` in the environment the lines are parabolas in log R (six numbers).

Usage: [DEG=2] python docs/probes/35/joint.py MODE SENDS [LEFT_OUT ...]  (LEFT_OUT 0: fit on all five)
Reads benchmarks/diff/results/full/calibrate (a full profile's) and config/config.yaml.
"""

import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
import torch
import yaml
from scipy.optimize import minimize

from isaac_net.core.config import CellConfig
from isaac_net.core.diff import calibrate
from isaac_net.core.diff.calibrate.fleet import FleetCalibration, model_envs_for
from isaac_net.core.diff.calibrate.loss import loss, neighbours
from isaac_net.core.diff.calibrate.targets import problem

torch.set_num_threads(1)
RES = "benchmarks/diff/results/full/calibrate"
P = yaml.safe_load(open("config/config.yaml"))["calibrate"]
SIZES = tuple(P["R"])
REF = int(P["ref_R"])
X0 = math.log(16.0)
DEG = int(os.environ.get("DEG", "1"))


def grid(R):
    g = P["grid"]
    points = calibrate.product_grid(g["p"], g["sizes_bytes"], g["tx_dbm"])
    return calibrate.scaled_points(points, R, ref_R=REF)


def targets(R):
    d = json.load(open(f"{RES}/targets_train_R{R}.json"))
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in d["kpis"].items()}


class Size:
    """One fleet size's training points, targets and loss of a Calibration's constants."""

    def __init__(self, mode, sends, R, spread):
        n = model_envs_for(R, int(P["model_robots"]), int(P["envs"]), spread)
        self.part = problem(grid(R), R=R, area_m=P["area_m"], envs=int(P["envs"]), T=int(P["T"]),
                            warmup=int(P["warmup"]), seed=int(P["seed"])).first(n)
        self.pairs, self.t, self.R, self.mode, self.sends = neighbours(grid(R)), targets(R), R, mode, sends

    def loss(self, c):
        cell = dataclasses.replace(CellConfig(), **c.constants)
        k = calibrate.model_kpis(self.mode, self.sends, self.part, cell, tau=c.tau, lam=float(P["lam"]),
                                 compile=bool(P["compile"]))
        return float(loss(k, self.t, self.pairs, float(P["slope_weight"]))[0])


def form(fc, theta, R):
    """The constants at R: ``fc.at(R)``'s with the capacity factor and offset of the lines theta."""
    x = math.log(R) - X0
    rf, off = np.polyval(theta[:DEG + 1], x), np.polyval(theta[DEG + 1:], x)
    return dataclasses.replace(fc.at(R), rate_factor=float(math.exp(rf)), snr_offset_db=float(off))


def start(fits):
    x = np.log([c.R[0] for c in fits]) - X0
    # np.polyval's order: the highest power first
    return np.concatenate([np.polyfit(x, np.log([c.rate_factor for c in fits]), DEG),
                           np.polyfit(x, [c.snr_offset_db for c in fits], DEG)])


def main():
    mode, sends = sys.argv[1], sys.argv[2]
    left_outs = [int(v) for v in sys.argv[3:]] or [0]
    fc_all = calibrate.Calibration.load(f"{RES}/fit_{mode}_{sends}.json", mode=mode, sends=sends)
    forms = {f["R"]: f for f in json.load(open(f"{RES}/fit_{mode}_{sends}.json"))["forms"]}
    sizes = {R: Size(mode, sends, R, fc_all.at(R).load_spread) for R in SIZES}
    evals = int(P.get("joint_evals", 0)) or 240
    for lo in left_outs:
        fits = tuple(c for c in fc_all.fits if c.R[0] != lo)
        fc = FleetCalibration(mode, sends, fits)
        train = [R for R in SIZES if R != lo]
        t0 = time.perf_counter()

        def objective(theta, fc=fc, train=train):
            return sum(sizes[R].loss(form(fc, theta, R)) for R in train)

        th0 = start(fits)
        f0 = objective(th0)
        steps = np.diag([0.1] * (DEG + 1) + [1.0] * (DEG + 1))  # log capacity factor, offset dB
        res = minimize(objective, th0, method="Nelder-Mead",
                       options={"maxfev": evals, "xatol": 1e-3, "fatol": 1e-4,
                                "initial_simplex": np.array([th0] + [th0 + d for d in steps])})
        per = {R: sizes[R].loss(form(fc, res.x, R)) for R in train}
        row = {"mode": mode, "sends": sends, "deg": DEG, "left_out": lo, "theta": res.x.tolist(),
               "nfev": res.nfev,
               "line_start_sum": f0, "joint_sum": float(res.fun), "joint_per_size": per,
               "own_per_size": {R: forms[R]["own"] for R in train},
               "wall_s": time.perf_counter() - t0}
        if lo:
            row["left_out_joint"] = sizes[lo].loss(form(fc, res.x, lo))
            row["left_out_between"] = forms[lo]["between"]
            row["left_out_line_start"] = sizes[lo].loss(form(fc, th0, lo))
        else:
            row["at_24_48"] = {R: {"rate_factor": form(fc, res.x, R).rate_factor,
                                   "snr_offset_db": form(fc, res.x, R).snr_offset_db} for R in (24, 48)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
