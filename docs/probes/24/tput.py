"""Is QAD mf cal's d throughput / d tx at fleet32 the model's (its own central FD, float64) or a
gradient bug? Autograd against the model's FD on the same sends, at the committed calibration.
argv: op, then 'draw' (the cells drawn in float64: another instance) or 'same' (the stage's float32
instance run in float64)."""
import sys
sys.path.insert(0, "/work/main/benchmarks/diff")
import torch, yaml
torch.set_num_threads(1)
import sensitivity as S
from _common import cell_config
from isaac_net.core.diff import DiffFluid, rollout
from isaac_net.core.diff.calibrate import Calibration

op_name = sys.argv[1] if len(sys.argv) > 1 else "fleet32"
same = len(sys.argv) > 2 and sys.argv[2] == "same"
params = yaml.safe_load(open("/work/main/config/config.yaml"))["sensitivity"]
op = S.ops_by_name(params)[op_name]
n_seeds, T, warmup = (int(params[k]) for k in ("n_seeds", "T", "warmup"))
per = int(op.get("envs_per_seed", params["envs_per_seed"]))
R = int(op.get("R", params["R"]))
dtype = torch.float64
base = S.problem(op, n_seeds, per, R, T, int(params["seed"]), torch.float32 if same else dtype)
base = {k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in base.items()}
cal = Calibration.load("/work/main/benchmarks/diff/results/full/calibration.json", mode="QA", sends="mean_field").at(R)
cfg = cal.apply(cell_config(params.get("cell", {})), R=R, area_m=op.get("area_m", [40.0, 140.0]))
grads, vals = S.model_gradients(base, "QA", "mf", n_seeds, T, warmup, cal.tau, float(params["lam"]), cfg)


def kpis(shift):
    x = S.inputs_at(base, shift, n_seeds)
    E = base["p"].shape[0]
    net = DiffFluid(E, R, "cpu", mode="QA", tau=cal.tau, cfg=cfg, dtype=dtype)
    with torch.no_grad():
        res = rollout(net, T, x["p"], x["B"], pos=x["pos"], tx_dbm=x["tx_dbm"], warmup=warmup,
                      sends="mean_field", lam=float(params["lam"]))
    return {k: v.double() for k, v in S.replicate_kpis(res, n_seeds).items()}


for name, h in (("tx_db", 0.5), ("p", 0.002)):
    if name not in S.INPUTS:
        continue
    up, dn = kpis({name: h}), kpis({name: -h})
    for kpi in ("mean_throughput_bytes_per_s", "delivery_ratio", "mean_delay"):
        fd = ((up[kpi] - dn[kpi]) / (2 * h)).mean().item()
        print(f"{op_name} d {kpi} / d {name}: autograd {grads[(kpi, name)].mean().item():.5g} model FD {fd:.5g} "
              f"value {vals[kpi].mean().item():.5g}", flush=True)
