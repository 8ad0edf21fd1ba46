"""Probe (30), first step: at a fleet point, QAD relaxed with the committed constants at its R and the
service varying per step (svcvar.py, SIGMA), its capacity factor scaled until its mean delay is
L2-legacy's there; then its d delay / d p and d AoI / d p (the sensitivity stage's model_gradients, the
stage's replicates and send uniforms). argv: point name, L2-legacy's mean delay there (steps), sigmas;
CAL (environment, optional): another calibration file than the page's; SE_MAX: the model's
spectral-efficiency cap (probe (31)); PATCH=crowd (with BETA): crowd.py's
rate in place of svcvar.py's (SIGMAS then 0 only)."""
import dataclasses, math, os, sys
sys.path.insert(0, "/work/main/benchmarks/diff"); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch, yaml
torch.set_num_threads(1)
import svcvar
if os.environ.get("PATCH") == "crowd":
    import crowd  # noqa: F401  (its factor replaces svcvar's)
import sensitivity as S
from _common import cell_config
from isaac_net.core.diff.calibrate import Calibration

name, target = sys.argv[1], float(sys.argv[2])
params = yaml.safe_load(open("/work/main/config/config.yaml"))["sensitivity"]
op = S.ops_by_name(params)[name]
R, n_seeds, T, warmup = int(op["R"]), int(params["n_seeds"]), int(params["T"]), int(params["warmup"])
base = S.problem(op, n_seeds, int(op.get("envs_per_seed", params["envs_per_seed"])), R, T, int(params["seed"]),
                 torch.float32)
cal = Calibration.load(os.environ.get("CAL", "/work/main/benchmarks/diff/results/full/calibration.json"), mode="QA",
                       sends="relaxed").at(R)
cfg0 = cal.apply(cell_config(params.get("cell", {})), R=R, area_m=op["area_m"])
if os.environ.get("SE_MAX"):  # probe (31) (b): the model's spectral-efficiency cap, b/s/Hz
    cfg0 = dataclasses.replace(cfg0, se_max=float(os.environ["SE_MAX"]))


def run(m):
    cfg = dataclasses.replace(cfg0, rate_factor=cfg0.rate_factor * m)
    g, k = S.model_gradients(base, "QA", "rb", n_seeds, T, warmup, cal.tau, float(params["lam"]), cfg)
    return float(k["mean_delay"].mean()), g


for sigma in [float(s) for s in sys.argv[3].split(",")]:
    svcvar.SIGMA = sigma
    lm, (d, g) = 0.0, run(1.0)
    d0, g0 = d, g
    prev = (0.1, run(math.exp(0.1))[0])
    for _ in range(8):  # secant in log m on log delay
        if abs(d - target) < 0.01:
            break
        slope = (math.log(prev[1]) - math.log(d)) / (prev[0] - lm)
        nxt = lm + (math.log(target) - math.log(d)) / slope
        prev = (lm, d)
        lm = nxt
        d, g = run(math.exp(lm))
    dd, da = (g[(k, "p")] for k in ("mean_delay", "mean_aoi"))
    print(f"{name} sigma {sigma}: at the committed constants delay {d0:.3f}, d delay / d p "
          f"{float(g0[('mean_delay', 'p')].mean()):.2f}, d AoI / d p {float(g0[('mean_aoi', 'p')].mean()):.2f}; "
          f"capacity x{math.exp(lm):.3f}, delay {d:.3f} (L2-legacy {target}); "
          f"d delay / d p {float(dd.mean()):.2f} (sd {float(dd.std()):.1f}), d AoI / d p {float(da.mean()):.2f} "
          f"(sd {float(da.std()):.1f})", flush=True)
