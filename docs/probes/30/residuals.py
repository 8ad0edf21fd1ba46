"""Probe (30): a QAD relaxed calibration's mean delay against L2-legacy's at each training and held-out
point of one size, the model on all 16 cells of a point. argv: calibration file, R."""
import sys
sys.path.insert(0, "/work/main/benchmarks/diff")
import torch, yaml
torch.set_num_threads(1)
import calibrate as C
from isaac_net.core.diff import calibrate

params = yaml.safe_load(open("/work/main/config/config.yaml"))["calibrate"]
res = "/work/main/benchmarks/diff/results/full"
path, R = sys.argv[1], int(sys.argv[2])
cal = calibrate.Calibration.load(path, mode="QA", sends="relaxed").at(R)
kw = C._fit_kwargs(params)
for part in ("train", "heldout"):
    points = C.point_set(params, R, part)
    prob = calibrate.problem(points, R=R, area_m=kw["area_m"], envs=kw["envs"], T=kw["T"], warmup=kw["warmup"],
                             seed=kw["seed"])
    k = calibrate.model_kpis("QA", "relaxed", prob, cal.apply(kw["cfg"], R=R), tau=cal.tau, lam=kw["lam"])
    tg = C._kpis([f"{res}/calibrate/targets_{part}_R{R}.json"], (R,))[R]
    for i, pt in enumerate(points):
        print(f"R {R} {part} p R {pt[0] * R:.2f} size {pt[1] / 1e3:.0f} kB tx {pt[2]:.0f}: delay model "
              f"{float(k['mean_delay'][0, i]):.2f} L2-legacy {float(tg['mean_delay'][i]):.2f}", flush=True)
