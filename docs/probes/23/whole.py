"""Probe (23): does the continuation's window (each size's search within one grid step of its
neighbour's choice) bind QAD relaxed? Each size refitted with the whole search (neighbour=None),
against the committed continuation fit of that size; training loss decides (the held-out sizes and
points are not used). argv: sizes (comma), mode, sends. Writes /tmp/p23/cal_whole_{mode}_{sends}.json,
every other size the committed fit's."""
import sys, time
sys.path.insert(0, "/work/main/benchmarks/diff")
import torch, yaml
torch.set_num_threads(1)
import calibrate as C
from isaac_net.core.diff import calibrate

sizes, mode, sends = [int(r) for r in sys.argv[1].split(",")], sys.argv[2], sys.argv[3]
params = yaml.safe_load(open("/work/main/config/config.yaml"))["calibrate"]
res = "/work/main/benchmarks/diff/results/full"
kw = C._fit_kwargs(params)  # compile as the stage
spread = float(params["load_spread"][mode]) if sends == "mean_field" else 0.0
closure = bool(params["mf_backlog_closure"]) and mode == "QA" and sends == "mean_field"
committed = calibrate.Calibration.load(f"{res}/calibration.json", mode=mode, sends=sends)
fitted = {R: committed.at(R) for R in committed.R}
for R in sizes:
    t0 = time.perf_counter()
    cal = calibrate.fit_size(mode, sends, R=R, neighbour=None, grid=C.point_set(params, R, "train"),
                             heldout=C.point_set(params, R, "heldout"), level=params["level"],
                             tau=float(params["tau"]), search=params["search"],
                             targets=C._kpis([f"{res}/calibrate/targets_train_R{R}.json"], (R,))[R],
                             heldout_targets=C._kpis([f"{res}/calibrate/targets_heldout_R{R}.json"], (R,))[R],
                             progress=False, load_spread=spread, mf_backlog_closure=closure, **kw)
    c, o = cal.to_dict(), committed.at(R).to_dict()
    print(f"whole {mode} {sends} R {R}: floor {c['sr_slots']} tau {c['tau']:.3g} req {c['qa_snr_req_db']} "
          f"rf {c['rate_factor']:.3f} off {c['snr_offset_db']:.2f} train {c['train_loss']:.4f} "
          f"held {c['heldout_loss']:.3f} stable {c['gradient_check']['stable']} | continuation: floor "
          f"{o['sr_slots']} tau {o['tau']:.3g} req {o['qa_snr_req_db']} train {o['train_loss']:.4f} "
          f"held {o['heldout_loss']:.3f} | {time.perf_counter() - t0:.0f} s", flush=True)
    fitted[R] = cal
    calibrate.FleetCalibration(mode, sends, tuple(fitted[r] for r in sorted(fitted))).save(
        f"/tmp/p23/cal_whole_{mode}_{sends}.json")
