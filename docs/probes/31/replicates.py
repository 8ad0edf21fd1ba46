"""Probe (31) (d): at a sensitivity point, L2-legacy's central FD and a calibrated model's autograd
derivative on more replicates than the stage's 32 (batches of 32 with disjoint seeds: batch k draws
the stage's replicates with the seed ``seed + 32 k``; batch 0 is the stage's own), to tell a
systematic sign miss from the replicates' noise. argv: point name, batches, calibration file
(optional; the page's), mode (QA), sends code (rb); SE_MAX (environment, optional): the model's
spectral-efficiency cap. Prints per batch and pooled: mean and standard error of d AoI / d p and
d delay / d p (L2-legacy FD, model), and the mean delays."""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
from _point import S, setup

a = setup(sys.argv)
name, batches, params, op, cfg, dtype, cal, mcfg = a.name, a.batches, a.params, a.op, a.cfg, a.dtype, a.cal, a.mcfg
n_seeds, T, warmup, per, R, mode, sends = a.n_seeds, a.T, a.warmup, a.per, a.R, a.mode, a.sends
steps = S.fd_steps_at(params, R)
keys = [("mean_aoi", "p"), ("mean_delay", "p")]
pooled = {("fd",) + k: [] for k in keys} | {("model",) + k: [] for k in keys}
for b in range(batches):
    seed = int(params["seed"]) + n_seeds * b
    base = S.problem(op, n_seeds, per, R, T, seed, dtype)
    fd, l2v = S.l2_fd(base, n_seeds, T, warmup, steps, seed, cfg, dtype, params["level"])
    g, mv = S.model_gradients(base, mode, sends, n_seeds, T, warmup, cal.tau, float(params["lam"]), mcfg)
    row = {"batch": b, "L2_delay": float(l2v["mean_delay"].mean()), "model_delay": float(mv["mean_delay"].mean())}
    for k in keys:
        for who, src in (("fd", fd), ("model", g)):
            x = src[k].numpy()
            pooled[(who,) + k].append(x)
            row[f"{who} d {k[0]} / d {k[1]}"] = [round(float(x.mean()), 3), round(float(x.std(ddof=1) / np.sqrt(len(x))), 3)]
    print(json.dumps(row), flush=True)
out = {}
for key, xs in pooled.items():
    x = np.concatenate(xs)
    out[f"{key[0]} d {key[1]} / d {key[2]}"] = [round(float(x.mean()), 3), round(float(x.std(ddof=1) / np.sqrt(len(x))), 3)]
print(json.dumps({"pooled": out, "replicates": n_seeds * batches}), flush=True)
