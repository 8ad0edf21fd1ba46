"""Probe (20): a calibration's QAD gradients at every sensitivity point, against the committed
L2-legacy FD rows (sensitivity/op_*.json): sign agreement, median ratio, within x2 per point group.
argv: calibration path, sends code (mf|rb), 'new' (time re-shared QAD, qad_wc), 're' (probe (26):
docs/probes/26/reshare.py, the share from the environment's RESHARE), 'pool' (probe (29):
docs/probes/29/pool.py in place of the product's re-shared interval, the share the calibration's),
'crowd' (probe (30): docs/probes/30/crowd.py, BETA from the environment), 'slope' (probe (31):
docs/probes/31/slope.py, SLOPE from the environment), 'serial' (probe (31): docs/probes/31/serial.py), 'lanes' (probe (31): docs/probes/31/lanes.py), 'spread' (probe (32): docs/probes/32/spread.py) or
'old'; SE_MAX (environment, optional): the
model's spectral-efficiency cap (probe (31)), ops (comma) or all."""
import dataclasses, json, os, sys, time
sys.path.insert(0, "/work/main/benchmarks/diff"); sys.path.insert(0, "/tmp/probe")
import numpy as np, torch, yaml
torch.set_num_threads(1)
if sys.argv[3] == "new":
    import qad_wc  # noqa: F401
elif sys.argv[3] == "re":
    sys.path.insert(0, "/tmp/p26")
    import reshare  # noqa: F401
elif sys.argv[3] == "crowd":  # probe (30) (e), BETA from the environment
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "30"))
    import crowd  # noqa: F401
elif sys.argv[3] == "slope":  # probe (31), SLOPE from the environment
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "31"))
    import slope  # noqa: F401
elif sys.argv[3] == "lanes":  # probe (31) (g)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "31"))
    import lanes  # noqa: F401
elif sys.argv[3] == "spread":  # probe (32) (b), GRANT_SB / PF_EXP from the environment
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "32"))
    import spread  # noqa: F401
elif sys.argv[3] == "serial":  # probe (31) (f)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "31"))
    import serial  # noqa: F401
elif sys.argv[3] == "pool":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "29"))
    import pool  # noqa: F401
elif sys.argv[3].startswith("poisson") or sys.argv[3] == "cond":
    sys.path.insert(0, "/tmp/p20")
    import cond_patch
    cond_patch.VARIANT = sys.argv[3]
import sensitivity as S
from _common import KPIS, cell_config
from isaac_net.core.diff.calibrate import Calibration

path, sends, tag = sys.argv[1], sys.argv[2], sys.argv[3]
params = yaml.safe_load(open("/work/main/config/config.yaml"))["sensitivity"]
res = "/work/main/benchmarks/diff/results/full/sensitivity"
ops = list(S.ops_by_name(params)) if sys.argv[4] == "all" else sys.argv[4].split(",")
cal_all = Calibration.load(path, mode="QA", sends=S.SEND_MODEL_OF_CODE[sends])
dtype = getattr(torch, params.get("dtype", "float32"))
cfg = cell_config(params.get("cell", {}))
if os.environ.get("SE_MAX"):  # probe (31) (b): the model's spectral-efficiency cap, b/s/Hz
    cfg = dataclasses.replace(cfg, se_max=float(os.environ["SE_MAX"]))
n_seeds, T, warmup = (int(params[k]) for k in ("n_seeds", "T", "warmup"))
label = f"QAD {sends} cal"
for name in ops:
    t0 = time.perf_counter()
    op = S.ops_by_name(params)[name]
    per = int(op.get("envs_per_seed", params["envs_per_seed"]))
    R = int(op.get("R", params["R"]))
    base = S.problem(op, n_seeds, per, R, T, int(params["seed"]), dtype)
    cal = cal_all.at(R)
    mcfg = cal.apply(cfg, R=R, area_m=op.get("area_m", [40.0, 140.0]))
    grads, _ = S.model_gradients(base, "QA", sends, n_seeds, T, warmup, cal.tau, float(params["lam"]), mcfg)
    rows = [r for r in json.load(open(f"{res}/op_{name}.json"))["rows"] if r["model"] == label]
    out = []
    for r in rows:
        g = grads[(r["kpi"], r["input"])].numpy()
        out.append({"kpi": r["kpi"], "input": r["input"], "sig": r["fd_significant"], "fd": r["fd_mean"],
                    "old": r["grad_mean"], "new": float(g.mean()), "new_sd": float(g.std())})
    print(json.dumps({"op": name, "R": R, "held_out": bool(op.get("held_out", False)), "tag": tag,
                      "rows": out, "s": time.perf_counter() - t0}), flush=True)
