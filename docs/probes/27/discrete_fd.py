"""Probe (27): central differences (common random numbers) of the calibrated discrete QA level at a
sensitivity point, with QAD relaxed's and QAD mean-field's constants at its R, beside L2-legacy's
committed rows and the model's autograd. argv: points (comma). Run from a checkout of main after a
full profile."""
import json
import sys

sys.path.insert(0, "benchmarks/diff")
import torch
import yaml

torch.set_num_threads(1)
import sensitivity as S  # noqa: E402
from _common import cell_config  # noqa: E402

from isaac_net.core.diff.calibrate import Calibration  # noqa: E402

RESULTS = "benchmarks/diff/results/full"
KPIS = ("mean_delay", "mean_aoi", "delivery_ratio")
params = yaml.safe_load(open("config/config.yaml"))["sensitivity"]
cfg = cell_config(params.get("cell", {}))
n_seeds, T, warmup = (int(params[k]) for k in ("n_seeds", "T", "warmup"))
for name in sys.argv[1].split(","):
    op = S.ops_by_name(params)[name]
    per, R = int(op.get("envs_per_seed", params["envs_per_seed"])), int(op.get("R", params["R"]))
    base = S.problem(op, n_seeds, per, R, T, int(params["seed"]), torch.float32)
    rows = json.load(open(f"{RESULTS}/sensitivity/op_{name}.json"))["rows"]
    for code, sends in (("rb", "relaxed"), ("mf", "mean_field")):
        cal = Calibration.load(f"{RESULTS}/calibration.json", mode="QA", sends=sends).at(R)
        mcfg = cal.apply(cfg, R=R, area_m=op.get("area_m", [40.0, 140.0]))
        fd, vals = S.l2_fd(base, n_seeds, T, warmup, S.fd_steps_at(params, R), int(params["seed"]), mcfg,
                           torch.float32, "QA")
        mine = {r["kpi"]: r for r in rows if r["model"] == f"QAD {code} cal" and r["input"] == "p"}
        out = {k: {"L2": round(mine[k]["fd_mean"], 2), "QA fd": round(float(fd[(k, "p")].mean()), 2),
                   "se": round(float(fd[(k, "p")].std() / n_seeds ** 0.5), 2),
                   "model": round(mine[k]["grad_mean"], 2)} for k in KPIS}
        print(name, code, {k: round(float(vals[k].mean()), 3) for k in KPIS}, out, flush=True)
