"""Probe (32): a QAD calibration's KPIs at every training point of one size against L2-legacy's
targets, the model on all 16 cells of each point (as probe (30)'s expected loss).
argv: calibration file, R, sends (relaxed|mean_field), and 'spread' (optional: spread.py's patch, GRANT_SB /
PF_EXP from the environment). Prints a table: p, kB, dBm, then target /
model for delay (steps), delivery and AoI (steps), and the point's loss."""
import dataclasses, os, sys
sys.path.insert(0, "/work/main/benchmarks/diff")
import torch, yaml
torch.set_num_threads(1)
PATCHED = len(sys.argv) > 4 and sys.argv[4] == "spread"
if PATCHED:  # spread.py's service runs off the fused node: the model eager
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import spread  # noqa: F401
import calibrate as C
from isaac_net.core.diff import calibrate
from isaac_net.core.diff.calibrate import fleet
from isaac_net.core.diff.calibrate.loss import point_loss

params = yaml.safe_load(open("/work/main/config/config.yaml"))["calibrate"]
res = "/work/main/benchmarks/diff/results/full"
path, R, sends = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kw = C._fit_kwargs(params)
grid = C.point_set(params, R, "train")
target = C._kpis([f"{res}/calibrate/targets_train_R{R}.json"], (R,))[R]
cal = calibrate.Calibration.load(path, mode="QA", sends=sends).at(R)
part = fleet.problem(grid, R=R, area_m=kw["area_m"], envs=kw["envs"], T=kw["T"], warmup=kw["warmup"],
                     seed=kw["seed"])
cell = dataclasses.replace(kw["cfg"], **cal.constants)
k = calibrate.evaluate.model_kpis("QA", sends, part, cell, tau=cal.tau, lam=kw["lam"], compile=not PATCHED)
pl = point_loss(k, target)
k = {key: v.reshape(-1) for key, v in k.items()}
pl = pl.reshape(-1)
print(f"R {R} {path}: rf {cal.constants.get('rate_factor'):.3f} off {cal.constants.get('snr_offset_db'):.2f}")
print("   p     kB  dBm | delay L2 / model | deliv L2 / model | AoI L2 / model | loss")
for i, (p, b, tx) in enumerate(grid):
    print(f"{p:6.3f} {b / 1000:5.0f} {tx:4.0f} | {target['mean_delay'][i]:6.2f} {k['mean_delay'][i]:6.2f} | "
          f"{target['delivery_ratio'][i]:.3f} {k['delivery_ratio'][i]:.3f} | {target['mean_aoi'][i]:6.2f} "
          f"{k['mean_aoi'][i]:6.2f} | {pl[i]:.3f}")
