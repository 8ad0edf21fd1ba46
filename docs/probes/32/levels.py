"""Probe (32): a QAD relaxed calibration's KPI levels at the sensitivity points (the stage's replicates
and send uniforms) beside L2-legacy's (the committed op JSONs). argv: calibration file, tag (a patch as
wc_sens.py's: 'old' or 'spread' with GRANT_SB / PF_EXP), ops (comma) or all."""
import json, os, sys
sys.path.insert(0, "/work/main/benchmarks/diff")
import torch, yaml
torch.set_num_threads(1)
if sys.argv[2] == "spread":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import spread  # noqa: F401
import sensitivity as S
from _common import cell_config
from isaac_net.core.diff.calibrate import Calibration

params = yaml.safe_load(open("/work/main/config/config.yaml"))["sensitivity"]
res = "/work/main/benchmarks/diff/results/full/sensitivity"
ops = S.ops_by_name(params)
names = list(ops) if sys.argv[3] == "all" else sys.argv[3].split(",")
cal_all = Calibration.load(sys.argv[1], mode="QA", sends="relaxed")
n_seeds, T, warmup = (int(params[k]) for k in ("n_seeds", "T", "warmup"))
for name in names:
    op = ops[name]
    R = int(op.get("R", params["R"]))
    base = S.problem(op, n_seeds, int(op.get("envs_per_seed", params["envs_per_seed"])), R, T, int(params["seed"]),
                     torch.float32)
    cal = cal_all.at(R)
    cfg = cal.apply(cell_config(params.get("cell", {})), R=R, area_m=op.get("area_m", [40.0, 140.0]))
    with torch.no_grad():
        k = S.model_kpis(base, S.inputs_at(base, {}, n_seeds), "QA", "rb", n_seeds, T, warmup, cal.tau,
                         float(params["lam"]), cfg)
    l2 = json.load(open(f"{res}/op_{name}.json"))["values"]["L2"]
    print(f"{name:9s} R {R:2d} delay L2 {l2['delay']:.2f} model {float(k['mean_delay'].mean()):.2f} | delivery "
          f"{l2['delivery']:.3f} {float(k['delivery_ratio'].mean()):.3f} | AoI {l2['AoI']:.2f} "
          f"{float(k['mean_aoi'].mean()):.2f}", flush=True)
