"""Probe (32) (c): local slopes at training points. At the training grid's points of R = 16 and 32
(16 kB, both powers, the five loads), the sensitivity stage's comparison (its replicates, FD steps and
resolved rows): L2-legacy's central differences with CRN (cached in /tmp/p32/l2_train_fd.pt) against a
QAD relaxed calibration's autograd derivatives. These points are the fit's own: a check of what its
loss (levels and secants between grid neighbours) leaves out, not an evaluation of held-out points.
argv: calibration file, tag ('old', or 'spread' with GRANT_SB / PF_EXP from the environment)."""
import json, os, sys
sys.path.insert(0, "/work/main/benchmarks/diff")
import numpy as np, torch, yaml
torch.set_num_threads(1)
if sys.argv[2] == "spread":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import spread  # noqa: F401
import sensitivity as S
from _common import cell_config
from isaac_net.core.diff.calibrate import Calibration

params = yaml.safe_load(open("/work/main/config/config.yaml"))
sp, cp = params["sensitivity"], params["calibrate"]
n_seeds, T, warmup = (int(sp[k]) for k in ("n_seeds", "T", "warmup"))
cfg = cell_config(sp.get("cell", {}))
FIT = ("mean_delay", "delivery_ratio", "mean_aoi", "mean_energy_j")
cache = "/tmp/p32/l2_train_fd.pt"
l2 = torch.load(cache) if os.path.exists(cache) else {}
cal_all = Calibration.load(sys.argv[1], mode="QA", sends="relaxed")
rows = []
for R in [int(r) for r in os.environ.get("SIZES", "16,32").split(",")]:
    for p0 in cp["grid"]["p"]:
        for tx in cp["grid"]["tx_dbm"]:
            op = {"name": f"R{R}_p{p0}_{tx:.0f}", "p": p0 * int(cp["ref_R"]) / R, "sizes_bytes": [16000],
                  "tx_dbm": tx, "area_m": cp["area_m"], "R": R, "envs_per_seed": max(1, 32 // R)}
            base = S.problem(op, n_seeds, op["envs_per_seed"], R, T, int(sp["seed"]), torch.float32)
            if op["name"] not in l2:
                fd, _ = S.l2_fd(base, n_seeds, T, warmup, S.fd_steps_at(sp, R), int(sp["seed"]), cfg,
                                torch.float32, sp["level"])
                l2[op["name"]] = fd
                torch.save(l2, cache)
            fd = l2[op["name"]]
            cal = cal_all.at(R)
            g, _ = S.model_gradients(base, "QA", "rb", n_seeds, T, warmup, cal.tau, float(sp["lam"]),
                                     cal.apply(cfg, R=R, area_m=op["area_m"]))
            for (kpi, inp), x in fd.items():
                if kpi not in FIT:
                    continue
                m, se = float(x.mean()), float(x.std() / np.sqrt(len(x)))
                if abs(m) > 2 * se:  # the stage's resolved rows
                    rows.append({"R": R, "tx": tx, "p": op["p"], "kpi": kpi, "input": inp, "fd": m,
                                 "model": float(g[(kpi, inp)].mean())})
out = {}
for name, sel in (("all", lambda r: True), ("23 dBm", lambda r: r["tx"] == 23.0), ("13 dBm", lambda r: r["tx"] == 13.0),
                  ("in p", lambda r: r["input"] == "p"), ("in tx", lambda r: r["input"] == "tx_db")):
    rs = [r for r in rows if sel(r)]
    rat = np.array([r["model"] / r["fd"] for r in rs])
    out[name] = {"n": len(rs), "sign": round(float(np.mean(rat > 0)), 3), "median": round(float(np.median(rat)), 3),
                 "within2": round(float(np.mean((rat >= 0.5) & (rat <= 2))), 3)}
print(json.dumps({"cal": sys.argv[1], "tag": sys.argv[2], "env": {k: os.environ.get(k) for k in ("GRANT_SB", "PF_EXP")},
                  "agreement": out}), flush=True)
for r in rows:
    if r["model"] / r["fd"] <= 0:
        print(f"   wrong: R {r['R']} {r['tx']:.0f} dBm p {r['p']:.3f} d {r['kpi']} / d {r['input']}: FD {r['fd']:.3g} "
              f"model {r['model']:.3g}", flush=True)
