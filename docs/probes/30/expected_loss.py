"""Probe (30): a QAD relaxed calibration's training and held-out losses at every fitted size with the
model run on all 16 cells of each point (the cells of L2-legacy's targets), where the fits run about
32 robots a point (one cell at R = 32 and 64): the loss the constants have in expectation over the
cells and send paths, on training points only (and the held-out loss for the record).
argv: calibration files; PATCH (environment, optional): a module of this folder to import first
(`crowd`, with BETA), of probe (29)'s (`pool`), of probe (31)'s (`lanes`, with LANE_SB) or of probe (32)'s (`spread`, with GRANT_SB / PF_EXP); SE_MAX (optional): the model's spectral-efficiency cap (probe (31)). Prints one line per file and size: own training / held-out loss."""
import dataclasses, os, sys
sys.path.insert(0, "/work/main/benchmarks/diff")
import torch, yaml
torch.set_num_threads(1)
if os.environ.get("PATCH"):
    here = os.path.dirname(os.path.abspath(__file__))
    # crowd (30), pool (29), spread (32), lanes (31; LANE_SB, probe (34))
    sys.path[:0] = [here, os.path.join(here, "..", "29"), os.path.join(here, "..", "32"), os.path.join(here, "..", "31")]
    __import__(os.environ["PATCH"])
import calibrate as C
from isaac_net.core.diff import calibrate

params = yaml.safe_load(open("/work/main/config/config.yaml"))["calibrate"]
res = "/work/main/benchmarks/diff/results/full"
sizes = [int(r) for r in params["R"]]
kw = {**C._fit_kwargs(params), "model_robots": int(os.environ.get("ROBOTS", 16 * max(sizes)))}
if os.environ.get("SE_MAX"):  # probe (31) (b): the model's spectral-efficiency cap, b/s/Hz
    kw["cfg"] = dataclasses.replace(kw["cfg"], se_max=float(os.environ["SE_MAX"]))
grids = {part: {R: C.point_set(params, R, part) for R in sizes} for part in ("train", "heldout")}
targets = {part: {R: C._kpis([f"{res}/calibrate/targets_{part}_R{R}.json"], (R,))[R] for R in sizes}
           for part in ("train", "heldout")}
for path in sys.argv[1:]:
    fc = calibrate.Calibration.load(path, mode="QA", sends="relaxed")  # a FleetCalibration
    out = {part: calibrate.fleet.size_losses(fc, ref_R=int(params["ref_R"]), grids=grids[part],
                                             targets=targets[part], **kw) for part in ("train", "heldout")}
    for tr, he in zip(out["train"], out["heldout"], strict=True):
        print(f"{os.path.basename(path)} R {tr['R']}: training {tr['own']:.4f} held-out {he['own']:.4f}", flush=True)
    print(f"{os.path.basename(path)} sum: training {sum(r['own'] for r in out['train']):.4f} held-out "
          f"{sum(r['own'] for r in out['heldout']):.4f}", flush=True)
