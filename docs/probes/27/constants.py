"""Probe (27): QAD relaxed's d KPI / d p at a sensitivity point under the constants that could serve
its R: the committed interpolation, each neighbouring fit, the log-R line, other temperatures, and
R = 32's fit replaced by the interpolation of R = 16 and 64. Evaluation only (see docs/design.md).
argv: the point's name (default fleet24), then any `field=value` variants of the interpolated
constants (e.g. tau=0.05; rate_factor=0.45,snr_offset_db=-7 is one variant of both).
Run from a checkout of main after a full profile."""
import dataclasses
import json
import sys

sys.path.insert(0, "benchmarks/diff")
import torch
import yaml

torch.set_num_threads(1)
import sensitivity as S  # noqa: E402
from _common import cell_config  # noqa: E402

from isaac_net.core.diff.calibrate import Calibration  # noqa: E402
from isaac_net.core.diff.calibrate.fleet import _interpolated, _log_linear  # noqa: E402

RESULTS = "benchmarks/diff/results/full"
params = yaml.safe_load(open("config/config.yaml"))["sensitivity"]
fc = Calibration.load(f"{RESULTS}/calibration.json", mode="QA", sends="relaxed")
cfg = cell_config(params.get("cell", {}))
n_seeds, T, warmup = (int(params[k]) for k in ("n_seeds", "T", "warmup"))
name = sys.argv[1] if len(sys.argv) > 1 else "fleet24"
op = S.ops_by_name(params)[name]
per, R = int(op.get("envs_per_seed", params["envs_per_seed"])), int(op.get("R", params["R"]))
base = S.problem(op, n_seeds, per, R, T, int(params["seed"]), torch.float32)
rows = [r for r in json.load(open(f"{RESULTS}/sensitivity/op_{name}.json"))["rows"]
        if r["model"] == "QAD rb cal" and r["input"] == "p"]
fits = {c.R[0]: c for c in fc.fits}
interp = fc.at(R)
new32 = dataclasses.replace(_interpolated(fits[16], fits[64], 32), provenance=fits[32].provenance)
variants = {"committed": interp, "R16": fits[16], "R32": fits[32], "loglin": _log_linear(fc.fits, R),
            "R32=interp(16,64)": _interpolated(fits[16], new32, R)}
for arg in sys.argv[2:]:  # field=value[,field=value ...]: one variant each
    fields = dict(kv.split("=") for kv in arg.split(","))
    variants[arg] = dataclasses.replace(interp, **{f: float(v) for f, v in fields.items()})
for label, cal in variants.items():
    cal = dataclasses.replace(cal, R=(R,))  # a neighbour's fit served at this R (apply warns once)
    mcfg = cal.apply(cfg, R=R, area_m=op.get("area_m", [40.0, 140.0]))
    grads, _ = S.model_gradients(base, "QA", "rb", n_seeds, T, warmup, cal.tau, float(params["lam"]), mcfg)
    out = {r["kpi"]: (round(r["fd_mean"], 3), round(float(grads[(r["kpi"], "p")].mean()), 3)) for r in rows}
    print(label, {k: getattr(cal, k) for k in ("rate_factor", "snr_offset_db", "sr_slots", "tau",
                                               "air_factor", "air_crowd_exp")}, out, flush=True)
