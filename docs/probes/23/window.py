"""Probe (23b): the continuation's window. Each size of QAD (or L1D) refitted by the stage's
continuation from the committed R = 8 fit, with the search narrowed by a variant of
_neighbour_search: 'req' (the headroom requirement within one grid step of the neighbour's as well),
'two' (floors and temperatures within two steps, the requirement within one). Training loss decides.
argv: variant, mode, sends."""
import sys, time
sys.path.insert(0, "/work/main/benchmarks/diff")
import torch, yaml
torch.set_num_threads(1)
import calibrate as C
from isaac_net.core.diff import calibrate
from isaac_net.core.diff.calibrate import fleet

variant, mode, sends = sys.argv[1], sys.argv[2], sys.argv[3]
_orig = fleet._neighbour_search


def around(values, chosen, k):
    values = sorted(float(v) for v in values)
    i = min(range(len(values)), key=lambda j: abs(values[j] - chosen))
    return values[max(0, i - k): i + k + 1]


def search_variant(search, prev, mode):
    out = _orig(search, prev, mode)
    k = 2 if variant == "two" else 1
    floors = search["sr_slots"][mode] if isinstance(search["sr_slots"], dict) else search["sr_slots"]
    out["sr_slots"] = [int(v) for v in around(floors, prev.sr_slots, k)]
    if search.get("tau") is not None:
        out["tau"] = around(search["tau"], prev.tau, k)
    if search.get("qa_snr_req_db") is not None and prev.qa_snr_req_db is not None:
        out["qa_snr_req_db"] = around(search["qa_snr_req_db"], prev.qa_snr_req_db, 1)
    return out


fleet._neighbour_search = search_variant
params = yaml.safe_load(open("/work/main/config/config.yaml"))["calibrate"]
res = "/work/main/benchmarks/diff/results/full"
kw = C._fit_kwargs(params)
spread = float(params["load_spread"][mode]) if sends == "mean_field" else 0.0
closure = bool(params["mf_backlog_closure"]) and mode == "QA" and sends == "mean_field"
committed = calibrate.Calibration.load(f"{res}/calibration.json", mode=mode, sends=sends)
ref = int(params["ref_R"])
fitted = {ref: committed.at(ref)}
total = 0.0
for R, nb in calibrate.continuation_order(committed.R, ref):
    if nb is None:
        continue
    t0 = time.perf_counter()
    cal = calibrate.fit_size(mode, sends, R=R, neighbour=fitted[nb], grid=C.point_set(params, R, "train"),
                             heldout=C.point_set(params, R, "heldout"), level=params["level"],
                             tau=float(params["tau"]), search=params["search"],
                             targets=C._kpis([f"{res}/calibrate/targets_train_R{R}.json"], (R,))[R],
                             heldout_targets=C._kpis([f"{res}/calibrate/targets_heldout_R{R}.json"], (R,))[R],
                             progress=False, load_spread=spread, mf_backlog_closure=closure, **kw)
    fitted[R] = cal
    c, o = cal.to_dict(), committed.at(R).to_dict()
    dt = time.perf_counter() - t0
    total += dt
    print(f"{variant} {mode} {sends} R {R}: floor {c['sr_slots']} tau {c['tau']:.3g} req {c['qa_snr_req_db']} "
          f"rf {c['rate_factor']:.3f} off {c['snr_offset_db']:.2f} train {c['train_loss']:.4f} "
          f"held {c['heldout_loss']:.3f} stable {c['gradient_check']['stable']} | committed: floor "
          f"{o['sr_slots']} tau {o['tau']:.3g} req {o['qa_snr_req_db']} train {o['train_loss']:.4f} "
          f"held {o['heldout_loss']:.3f} | {dt:.0f} s", flush=True)
    calibrate.FleetCalibration(mode, sends, tuple(fitted[r] for r in sorted(fitted))).save(
        f"/tmp/p23/cal_{variant}_{mode}_{sends}.json")
print(f"{variant} {mode} {sends}: continuation fits {total:.0f} s", flush=True)
