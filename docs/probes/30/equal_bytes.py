"""Probe (30) (g): at a fixed offered load in bytes a cell and step, L2-legacy's mean delay and the
committed calibrated QAD relaxed's (16 cells a point, the calibration's training-style cells) as the
message size changes (p = bytes / (R size)). argv: R, offered kB a cell and step, tx dBm, sizes in kB (comma);
CAL (environment, optional): another calibration file; PATCH=spread (optional): probe (32)'s service, with
GRANT_SB / PF_EXP."""
import os, sys
sys.path.insert(0, "/work/main/benchmarks/diff")
import torch, yaml
torch.set_num_threads(1)
if os.environ.get("PATCH") == "spread":  # probe (32) (b)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "32"))
    import spread  # noqa: F401
import calibrate as C
from isaac_net.core.diff import calibrate

params = yaml.safe_load(open("/work/main/config/config.yaml"))["calibrate"]
R, kb, tx = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
sizes = [float(s) for s in sys.argv[4].split(",")]
points = tuple((kb / (R * s), s * 1e3, tx) for s in sizes)
kw = C._fit_kwargs(params)
prob = calibrate.problem(points, R=R, area_m=kw["area_m"], envs=kw["envs"], T=kw["T"], warmup=kw["warmup"],
                         seed=kw["seed"])
l2 = calibrate.measure(prob, level=params["level"], seed=kw["seed"])
cal = calibrate.Calibration.load(os.environ.get("CAL", "/work/main/benchmarks/diff/results/full/calibration.json"), mode="QA",
                                 sends="relaxed").at(R)
m = calibrate.model_kpis("QA", "relaxed", prob, cal.apply(kw["cfg"], R=R), tau=cal.tau, lam=kw["lam"])
for i, (p, b, _) in enumerate(points):
    print(f"R {R} {kb:.0f} kB a step, {b / 1e3:.0f} kB messages (p R {p * R:.2f}), {tx:.0f} dBm: delay L2-legacy "
          f"{float(l2['mean_delay'][i]):.2f}, QAD rb cal {float(m['mean_delay'][0, i]):.2f} steps", flush=True)
