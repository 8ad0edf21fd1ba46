"""Probe (31) (e): where AoI is least in the send probability at a sensitivity point, on L2-legacy and
on a calibrated model, and what the model's choice costs on L2-legacy: the mean AoI of both on a grid of
p (the point's p times FACTORS), each p on the same replicates (positions, sizes, send uniforms and
L2-legacy's engine seed: common random numbers across p), batches of 32 replicates with disjoint seeds
as ``replicates.py``. A parabola through the pooled curve's least point and its two neighbours gives
each one's best p. argv: point name, batches, calibration file (optional; the page's), mode (QA), sends
code (rb). Prints the curves (mean and standard error over the replicates), both best p, and
L2-legacy's AoI at the model's best p over its own least (the share an optimiser of p on the model gives
up on L2-legacy)."""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np, torch
from _point import S, setup
from isaac_net.core.diff import DiffFluid, rollout
from isaac_net.core.diff.reference import discrete_rollout

FACTORS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5, 1.7, 2.0)
a = setup(sys.argv)
name, batches, params, op, cfg, dtype, cal, mcfg = a.name, a.batches, a.params, a.op, a.cfg, a.dtype, a.cal, a.mcfg
n_seeds, T, warmup, per, R, mode, sends = a.n_seeds, a.T, a.warmup, a.per, a.R, a.mode, a.sends
ps = [float(op["p"]) * f for f in FACTORS]
aoi = {"L2": [[] for _ in ps], "model": [[] for _ in ps]}
for b in range(batches):
    seed = int(params["seed"]) + n_seeds * b
    base = S.problem(op, n_seeds, per, R, T, seed, dtype)
    x = S.inputs_at(base, {}, n_seeds)
    for i, p in enumerate(ps):
        pp = torch.full_like(x["p"], p)
        res = discrete_rollout(params["level"], T, pp, x["B"], pos=x["pos"], tx_dbm=x["tx_dbm"], warmup=warmup,
                               u=base["u"], cfg=cfg, dtype=dtype, seed=seed)
        aoi["L2"][i].append(S.replicate_kpis(res, n_seeds)["mean_aoi"].double().numpy())
        net = DiffFluid(*pp.shape, "cpu", mode=mode, tau=cal.tau, cfg=mcfg, dtype=dtype)
        with torch.no_grad():
            res = rollout(net, T, pp, x["B"], pos=x["pos"], tx_dbm=x["tx_dbm"], warmup=warmup,
                          sends=S.SEND_MODEL_OF_CODE[sends], u=base["u"] if sends == "rb" else None,
                          lam=float(params["lam"]))
        aoi["model"][i].append(S.replicate_kpis(res, n_seeds)["mean_aoi"].double().numpy())
curves = {k: [np.concatenate(v) for v in vs] for k, vs in aoi.items()}


def best_p(mean):
    """The vertex of the parabola through the least grid point and its neighbours (log p)."""
    i = int(np.clip(np.argmin(mean), 1, len(ps) - 2))
    x, y = np.log(ps[i - 1:i + 2]), np.asarray(mean[i - 1:i + 2])
    a, b_, _ = np.polyfit(x, y, 2)
    return float(np.exp(-b_ / (2 * a))) if a > 0 else float(ps[int(np.argmin(mean))])


out = {"op": name, "R": R, "replicates": n_seeds * batches, "p": [round(p, 5) for p in ps]}
for k, cs in curves.items():
    out[k] = [[round(float(c.mean()), 4), round(float(c.std(ddof=1) / np.sqrt(len(c))), 4)] for c in cs]
l2_mean = np.array([c.mean() for c in curves["L2"]])
pl2, pm = best_p(l2_mean), best_p(np.array([c.mean() for c in curves["model"]]))
# L2-legacy's AoI at the model's best p: the interpolant of its curve in log p (piecewise linear)
l2_at_pm = float(np.interp(np.log(pm), np.log(ps), l2_mean))
out |= {"best_p_L2": round(pl2, 4), "best_p_model": round(pm, 4), "L2_aoi_min": round(float(l2_mean.min()), 4),
        "L2_aoi_at_model_best": round(l2_at_pm, 4), "L2_aoi_lost": round(l2_at_pm / float(l2_mean.min()) - 1.0, 4)}
print(json.dumps(out), flush=True)
