"""Probes (25) and (26): QAD with a service between QA's static share (a robot's share of the band
held for the step) and probe (19)'s time re-shared one (a drained robot's time goes to the others),
refitted by the stage's continuation (R = 8 whole search). argv: alpha, sends, sizes (comma), compile
(1/0) and the variant; START (environment, optional): a calibration file whose R = 8 fit is kept (the
continuation alone; probe (28)); MIN_ENVS (optional): at least this many cells a point through the
model at every size (probe (30)); REQ (optional): QAD's headroom requirement held at this value, dB
(probe (30)); SE_MAX (optional): the model's spectral-efficiency cap, b/s/Hz (probe (31)); FLOORS (optional): QA's latency floors searched, slots, comma-separated (probe
(32)); OUT
(optional): the calibration file written:
- 'mix' (25): the two services' completions, finish times, bytes served and time on air blended,
  (1 - alpha) static + alpha re-shared (each conserves mass, so the blend does); needs qad_wc.py
  (branch qa-work-conserving, docs/probes/19/) beside this script; ran eager;
- 'patch' (26): reshare.py's rule (a robot not being served leaves the share alpha of its time to
  the others) patched into QAD's service: what the share 0.5 ran as;
- 'product' (26): the same rule through the stage's fit_size(qa_reshare=alpha);
- 'pool' (29): docs/probes/29/pool.py's rule (the share alpha of the band's time pooled among the
  robots being served) in place of the product's, through the same fit_size(qa_reshare=alpha);
- 'crowd' (30): docs/probes/30/crowd.py's rate over smax(n, 1)^BETA (BETA from the environment);
- 'slope' (31): docs/probes/31/slope.py's rate SNR with a slope (SLOPE from the environment);
- 'serial' (31): docs/probes/31/serial.py's finish times of random-order serial service;
- 'lanes' (31): docs/probes/31/lanes.py's random-order serial service;
- 'power' (32): docs/probes/32/power.py's loss on the training points of one power (POWER_KEEP);
- 'spread' (32): docs/probes/32/spread.py's crowd SNR lift weakened (GRANT_SB, PF_EXP)."""
import dataclasses, os, sys, time
sys.path.insert(0, "/work/main/benchmarks/diff"); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch, yaml
torch.set_num_threads(1)
ALPHA, sends, sizes = float(sys.argv[1]), sys.argv[2], [int(r) for r in sys.argv[3].split(",")]
VARIANT = sys.argv[5]
if VARIANT == "patch":
    os.environ["RESHARE"] = sys.argv[1]
    import reshare  # noqa: F401  (patches model.MODES["QA"])
elif VARIANT == "mix":
    from isaac_net.core.diff import model, relax
    import qad_wc  # patches model.MODES["QA"]; keep its service, then install the blend

    def mixed(x, w, mass_before, snr_lin, headroom, cfg, tau, slot_grad="recompute"):
        static = model._service_qa(x, w, mass_before, snr_lin, headroom, cfg, tau, slot_grad)
        if relax.is_hard(tau) or ALPHA == 0.0:
            return static
        wc = qad_wc.service(x, w, mass_before, snr_lin, headroom, cfg, tau, slot_grad)
        return tuple((1.0 - ALPHA) * a + ALPHA * b for a, b in zip(static, wc, strict=True))

    model.MODES["QA"] = dataclasses.replace(model.MODES["QA"], service=mixed, fused_step=None)
elif VARIANT == "pool":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "29"))
    import pool  # noqa: F401  (patches model._reshared_qa)
elif VARIANT == "crowd":  # probe (30) (e): QAD's rate over smax(n, 1)^BETA (BETA from the environment)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "30"))
    import crowd  # noqa: F401  (patches model.MODES["QA"])
elif VARIANT == "slope":  # probe (31): the rate SNR's slope (SLOPE from the environment)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "31"))
    import slope  # noqa: F401  (patches radio.rate_snr_lin)
elif VARIANT == "serial":  # probe (31) (f): finish times of random-order serial service
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "31"))
    import serial  # noqa: F401  (patches model.MODES["QA"])
elif VARIANT == "lanes":  # probe (31) (g): a random-order serial service
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "31"))
    import lanes  # noqa: F401  (patches model.MODES["QA"])
elif VARIANT == "power":  # probe (32) (a): the training loss on one power's points (POWER_KEEP)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "32"))
    import power  # noqa: F401  (patches calibrate.search.loss)
elif VARIANT == "spread":  # probe (32) (b): the crowd's SNR lift weakened (GRANT_SB, PF_EXP)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "32"))
    import spread  # noqa: F401  (patches model.MODES["QA"])
elif VARIANT != "product":
    raise ValueError(f"variant: expected 'mix', 'patch', 'product', 'pool', 'crowd', 'slope', 'serial', 'lanes', 'power' or 'spread', got {VARIANT!r}")
import calibrate as C
from isaac_net.core.diff import calibrate

params = yaml.safe_load(open("/work/main/config/config.yaml"))["calibrate"]
res = "/work/main/benchmarks/diff/results/full"
if os.environ.get("SE_MAX"):  # probe (31) (b): the model's spectral-efficiency cap, b/s/Hz
    params["cell"] = {**(params.get("cell") or {}), "se_max": float(os.environ["SE_MAX"])}
kw = {**C._fit_kwargs(params), "compile": sys.argv[4] == "1"}
if os.environ.get("FLOORS"):  # probe (32): QA's latency floors searched, slots (comma)
    params["search"]["sr_slots"] = {**params["search"]["sr_slots"], "QA": [int(v) for v in os.environ["FLOORS"].split(",")]}
if os.environ.get("REQ"):
    params["search"]["qa_snr_req_db"] = [float(os.environ["REQ"])]
if os.environ.get("MIN_ENVS"):
    from isaac_net.core.diff.calibrate import fleet as _fleet
    _envs_for, _least = _fleet.model_envs_for, int(os.environ["MIN_ENVS"])
    _fleet.model_envs_for = lambda R, robots, envs, spread=0.0: min(int(envs), max(_envs_for(R, robots, envs, spread), _least))
spread = float(params["load_spread"]["QA"]) if sends == "mean_field" else 0.0
closure = bool(params["mf_backlog_closure"]) and sends == "mean_field"
committed = calibrate.Calibration.load(f"{res}/calibration.json", mode="QA", sends=sends)
ref = int(params["ref_R"])
fitted = {}
if os.environ.get("START"):
    fitted[ref] = calibrate.Calibration.load(os.environ["START"], mode="QA", sends=sends).at(ref)
for R, nb in calibrate.continuation_order(tuple(sorted(set(sizes) | {ref})), ref):
    if R in fitted:
        continue
    t0 = time.perf_counter()
    cal = calibrate.fit_size("QA", sends, R=R, neighbour=None if nb is None else fitted[nb],
                             grid=C.point_set(params, R, "train"), heldout=C.point_set(params, R, "heldout"),
                             level=params["level"], tau=float(params["tau"]), search=params["search"],
                             targets=C._kpis([f"{res}/calibrate/targets_train_R{R}.json"], (R,))[R],
                             heldout_targets=C._kpis([f"{res}/calibrate/targets_heldout_R{R}.json"], (R,))[R],
                             progress=False, load_spread=spread, mf_backlog_closure=closure,
                             qa_reshare=ALPHA if VARIANT in ("product", "pool", "spread") else 0.0, **kw)
    fitted[R] = cal
    c, o = cal.to_dict(), committed.at(R).to_dict()
    print(f"{VARIANT} {ALPHA} {sends} R {R}: floor {c['sr_slots']} tau {c['tau']:.3g} req {c['qa_snr_req_db']} "
          f"rf {c['rate_factor']:.3f} off {c['snr_offset_db']:.2f} train {c['train_loss']:.4f} "
          f"held {c['heldout_loss']:.3f} stable {c['gradient_check']['stable']} | committed: floor "
          f"{o['sr_slots']} tau {o['tau']:.3g} train {o['train_loss']:.4f} held {o['heldout_loss']:.3f} | "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    calibrate.FleetCalibration("QA", sends, tuple(fitted[r] for r in sorted(fitted))).save(
        os.environ.get("OUT", f"/tmp/cal_{VARIANT}{ALPHA}_{sends}.json"))
