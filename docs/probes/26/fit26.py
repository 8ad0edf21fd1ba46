"""Probe (26): QAD with a partial re-share of the band's time: a robot not being served leaves the
share alpha of its time to the others (alpha 0 QA's static share, 1 probe (19)'s rule). Refitted by
the stage's continuation (R = 8 whole search). argv: alpha, sends, sizes (comma), compile (1/0), and
'patch' (reshare.py patches QAD's service: what the share 0.5 ran as) or 'product' (the stage's
fit_size with qa_reshare=alpha, CellConfig.qa_reshare)."""
import os, sys, time
sys.path.insert(0, "/work/main/benchmarks/diff"); sys.path.insert(0, "/tmp/p26")
import torch, yaml
torch.set_num_threads(1)
PATCH = sys.argv[5] == "patch"
if PATCH:
    os.environ["RESHARE"] = sys.argv[1]
    import reshare  # noqa: F401  (patches model.MODES["QA"])
import calibrate as C
from isaac_net.core.diff import calibrate

ALPHA, sends, sizes = float(sys.argv[1]), sys.argv[2], [int(r) for r in sys.argv[3].split(",")]
params = yaml.safe_load(open("/work/main/config/config.yaml"))["calibrate"]
res = "/work/main/benchmarks/diff/results/full"
kw = {**C._fit_kwargs(params), "compile": sys.argv[4] == "1"}
spread = float(params["load_spread"]["QA"]) if sends == "mean_field" else 0.0
closure = bool(params["mf_backlog_closure"]) and sends == "mean_field"
committed = calibrate.Calibration.load(f"{res}/calibration.json", mode="QA", sends=sends)
ref = int(params["ref_R"])
fitted = {}
for R, nb in calibrate.continuation_order(tuple(sorted(set(sizes) | {ref})), ref):
    t0 = time.perf_counter()
    cal = calibrate.fit_size("QA", sends, R=R, neighbour=None if nb is None else fitted[nb],
                             grid=C.point_set(params, R, "train"), heldout=C.point_set(params, R, "heldout"),
                             level=params["level"], tau=float(params["tau"]), search=params["search"],
                             targets=C._kpis([f"{res}/calibrate/targets_train_R{R}.json"], (R,))[R],
                             heldout_targets=C._kpis([f"{res}/calibrate/targets_heldout_R{R}.json"], (R,))[R],
                             progress=False, load_spread=spread, mf_backlog_closure=closure,
                             qa_reshare=0.0 if PATCH else ALPHA, **kw)
    fitted[R] = cal
    c, o = cal.to_dict(), committed.at(R).to_dict()
    print(f"reshare {ALPHA} {sends} R {R}: floor {c['sr_slots']} tau {c['tau']:.3g} req {c['qa_snr_req_db']} "
          f"rf {c['rate_factor']:.3f} off {c['snr_offset_db']:.2f} train {c['train_loss']:.4f} "
          f"held {c['heldout_loss']:.3f} stable {c['gradient_check']['stable']} | committed: floor "
          f"{o['sr_slots']} tau {o['tau']:.3g} train {o['train_loss']:.4f} held {o['heldout_loss']:.3f} | "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    calibrate.FleetCalibration("QA", sends, tuple(fitted[r] for r in sorted(fitted))).save(
        f"/tmp/p26/cal_{'re' if PATCH else 'prod'}{ALPHA}_{sends}.json")
