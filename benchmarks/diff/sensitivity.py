"""Sensitivity of the relaxed models against L2-legacy finite differences.

For each operating point (light and heavy load), each input (send probability, message
size in kB, transmit power in dB, distance to the gNB in m) and each KPI (mean delay,
delivery ratio, mean AoI, mean energy per robot and step), the derivative of the KPI
with respect to a common shift of the input for every robot of a replicate:

* L1D and QAD with mean-field sends and with relaxed-Bernoulli sends (autograd, one
  value per replicate: mean ± std over replicates);
* L2-legacy central finite differences with common random numbers: the same engine seed
  (fading and BLER uniforms depend only on ``(E, R, t)``) and the same send uniforms
  ``u`` at ``x + h`` and ``x - h``; mean ± standard error over replicates.

A replicate ("seed") is a group of ``envs_per_seed`` cells with its own positions, message
sizes and send uniforms (generator ``seed + index``); all replicates run batched as envs
of one engine, so their fading streams are independent. With binary sends ``u < p`` the
finite difference in ``p`` is that of a step function averaged over seeds: only sends
whose uniform lies within ``h`` of ``p`` change, so the step must be large enough for
many to (the default 0.05 changes about 10 % of the sends). At a point with another fleet
size than the stage's the step in ``p`` is scaled by ``R_stage / R`` (``fd_steps_at``): it
changes the same expected number of sends per cell and step, and the same share of the
cell's offered load, at every fleet size (a fixed step would span the knee of a large cell).

Every model runs uncalibrated and with its calibration (``calibration.json`` of the
calibrate stage, ``Calibration.apply``, at the temperature it was fitted at,
``Calibration.tau``). The operating points are the stage points (light and heavy load) and
held-out points outside the calibration's training envelope (more robots per cell, a far
area, the opt_rates start), flagged ``held_out``.

Comparison per row: sign agreement of the model's mean with the FD mean (counted only
where the FD differs from zero by more than two standard errors; a model gradient below
``ZERO_RATIO`` of the FD counts as a disagreement, "model gradient 0"), the magnitude
ratio model / FD with a paired bootstrap 95 % interval over replicates, and whether the
ratio lies within a factor 2 of 1. One job per operating point (``part`` = ``op-<name>``),
then ``merge``.
"""


import json
import math
import time
import zlib

import numpy as np
import torch
from tqdm import tqdm

from isaac_net.core import kpi as kpi_registry

try:
    from _common import FITTED_KPIS, KPI_LABEL, KPIS, cell_config, generator, ratio_ci, run
    from _plots import gradient_ratios
except ImportError:  # imported as benchmarks.diff.sensitivity (tests)
    from benchmarks.diff._common import FITTED_KPIS, KPI_LABEL, KPIS, cell_config, generator, ratio_ci, run
    from benchmarks.diff._plots import gradient_ratios

INPUTS = ("p", "kbytes", "tx_db", "dist_m")
INPUT_LABEL = {"p": "p", "kbytes": "kB", "tx_db": "tx dB", "dist_m": "dist m"}
#: The rollout send model of each short code of the study's model names.
SEND_MODEL_OF_CODE = {"mf": "mean_field", "rb": "relaxed"}
ZERO_RATIO = 1e-3  # |model / FD| below this counts as a zero model gradient (a sign disagreement)
WITHIN = 2.0  # "ratio within x2": 1 / WITHIN <= model / FD <= WITHIN
VERDICTS = ("sign_ok", "sign_wrong", "fd_not_resolved", "model_zero")


def problem(op: dict, n_seeds: int, envs_per_seed: int, R: int, T: int, seed: int, dtype) -> dict:
    """Base inputs of all replicates, batched along envs (replicate ``s`` = envs
    ``[s * envs_per_seed, (s + 1) * envs_per_seed)``); ``op["R"]``, when given, replaces ``R``.

    :output p, B, tx, d, dir, u: ``[E, R]`` (``dir`` ``[E, R, 2]``, ``u`` ``[T, E, R]``),
        ``E = n_seeds * envs_per_seed``; positions uniform in ``op["area_m"]`` squared.
    """
    parts = []
    R = int(op.get("R", R))
    lo, hi = op.get("area_m", [40.0, 140.0])
    sizes = torch.tensor([float(s) for s in op["sizes_bytes"]], dtype=dtype)
    for s in range(n_seeds):
        g = generator(seed + s)
        pos = lo + (hi - lo) * torch.rand(envs_per_seed, R, 2, generator=g, dtype=dtype)
        B = sizes[torch.randint(len(sizes), (envs_per_seed, R), generator=g)]
        u = torch.rand(T, envs_per_seed, R, generator=g, dtype=dtype)
        parts.append((pos, B, u))
    pos = torch.cat([x[0] for x in parts])
    d = pos.norm(dim=-1)
    E = pos.shape[0]
    return {
        "p": torch.full((E, R), float(op["p"]), dtype=dtype),
        "B": torch.cat([x[1] for x in parts]),
        "tx": torch.full((E, R), float(op.get("tx_dbm", 23.0)), dtype=dtype),
        "d": d,
        "dir": pos / d.unsqueeze(-1),
        "u": torch.cat([x[2] for x in parts], dim=1),
    }


def inputs_at(base: dict, shift: dict, n_seeds: int) -> dict:
    """Decisions with per-replicate shifts ``shift[name]`` (``[n_seeds]`` or scalar) applied."""
    E = base["p"].shape[0]
    per = E // n_seeds

    def env(name):
        v = shift.get(name, 0.0)
        if isinstance(v, torch.Tensor) and v.ndim == 1:
            return v.repeat_interleave(per).unsqueeze(-1)
        return v

    return {
        "p": base["p"] + env("p"),
        "B": base["B"] + 1000.0 * env("kbytes"),
        "tx_dbm": base["tx"] + env("tx_db"),
        "pos": base["dir"] * (base["d"] + env("dist_m")).unsqueeze(-1),
    }


def replicate_kpis(res: dict, n_seeds: int) -> dict:
    """Per-replicate batch KPIs ``[n_seeds]`` from a rollout's per-robot totals (the KPI registry's)."""
    from isaac_net.core.kpi import grouped_batch_kpis

    return grouped_batch_kpis(res, n_seeds)


def model_kpis(base, x, mode, sends, n_seeds, T, warmup, tau, lam, cfg) -> dict:
    """The model's per-replicate KPIs ``{kpi: [n_seeds]}`` at the decisions ``x`` (``inputs_at``'s), on
    the base point's send uniforms (relaxed sends); differentiable in ``x``."""
    from isaac_net.core.diff import DiffFluid, rollout

    E, R = base["p"].shape
    net = DiffFluid(E, R, base["p"].device, mode=mode, tau=tau, cfg=cfg, dtype=base["p"].dtype)
    res = rollout(net, T, x["p"], x["B"], pos=x["pos"], tx_dbm=x["tx_dbm"], warmup=warmup,
                  sends=SEND_MODEL_OF_CODE[sends], u=base["u"] if sends == "rb" else None, lam=lam)
    return replicate_kpis(res, n_seeds)


def model_gradients(base, mode, sends, n_seeds, T, warmup, tau, lam, cfg) -> dict:
    """Autograd derivatives ``{(kpi, input): [n_seeds]}`` and KPI values ``{kpi: [n_seeds]}``."""
    dev = base["p"].device
    shift = {k: torch.zeros(n_seeds, dtype=base["p"].dtype, device=dev, requires_grad=True) for k in INPUTS}
    k = model_kpis(base, inputs_at(base, shift, n_seeds), mode, sends, n_seeds, T, warmup, tau, lam, cfg)
    grads = {}
    for i, kpi in enumerate(KPIS):
        g = torch.autograd.grad(k[kpi].sum(), [shift[n] for n in INPUTS], retain_graph=i < len(KPIS) - 1,
                                allow_unused=True)
        for name, gi in zip(INPUTS, g, strict=True):
            grads[(kpi, name)] = (torch.zeros(n_seeds) if gi is None else gi.detach().cpu()).double()
    return grads, {kpi: v.detach().cpu().double() for kpi, v in k.items()}


def level_kpis(base, x, n_seeds, T, warmup, engine_seed, cfg, dtype, level) -> dict:
    """The discrete level's per-replicate KPIs ``{kpi: [n_seeds]}`` (float64, CPU) at the decisions ``x``
    (``inputs_at``'s) on the base point's send uniforms and the engine seed ``engine_seed``: every call
    with the same base and seed shares the random numbers (positions, sends, fading, BLER)."""
    from isaac_net.core.diff.reference import discrete_rollout

    res = discrete_rollout(level, T, x["p"], x["B"], pos=x["pos"], tx_dbm=x["tx_dbm"], warmup=warmup,
                           u=base["u"], cfg=cfg, dtype=dtype, seed=engine_seed, device=base["p"].device)
    return {k: v.cpu().double() for k, v in replicate_kpis(res, n_seeds).items()}


def l2_fd(base, n_seeds, T, warmup, steps, engine_seed, cfg, dtype, level,
          progress=None) -> tuple[dict, dict]:
    """Central FD ``{(kpi, input): [n_seeds]}`` of ``level`` with CRN, and its KPIs at the base point."""

    def kpis_at(shift):
        return level_kpis(base, inputs_at(base, shift, n_seeds), n_seeds, T, warmup, engine_seed, cfg, dtype,
                          level)

    jobs = [(None, 0.0)] + [(name, sgn) for name in INPUTS for sgn in (1.0, -1.0)]
    it = jobs if progress is None else progress(jobs)
    vals = {}
    for name, sgn in it:
        vals[(name, sgn)] = kpis_at({} if name is None else {name: sgn * float(steps[name])})
    fd = {}
    for kpi in KPIS:
        for name in INPUTS:
            h = float(steps[name])
            fd[(kpi, name)] = (vals[(name, 1.0)][kpi] - vals[(name, -1.0)][kpi]) / (2.0 * h)
    return fd, vals[(None, 0.0)]


def fd_steps_at(params: dict, R: int) -> dict:
    """The central-difference half steps at a point with ``R`` robots per cell: ``params["fd_steps"]``,
    the one in ``p`` scaled by ``params["R"] / R``, so that ``2 h R`` (the expected sends a step of
    each sign changes per cell and step) is the stage's at every fleet size."""
    if isinstance(R, bool) or not isinstance(R, int) or R < 1:
        raise ValueError(f"R: expected a positive int (robots per cell), got {R!r}")
    steps = {k: float(v) for k, v in params["fd_steps"].items()}
    steps["p"] *= int(params["R"]) / R
    return steps


def ops_by_name(params: dict) -> dict:
    """The operating points ``{name: point}`` in config order (``params["ops"]``: a list of named points)."""
    return {op["name"]: op for op in params["ops"]}


def model_list(params: dict) -> list[tuple]:
    """``(mode, sends, calibrated)`` of every model column, uncalibrated before calibrated."""
    return [(m, sd, cal) for m in params["modes"] for sd in params["sends"] for cal in (False, True)]


def model_label(mode: str, sends: str, calibrated: bool) -> str:
    return f"{mode}D {sends}" + (" cal" if calibrated else "")


def load_calibrations(path: str | None, params: dict) -> dict:
    """``{(mode, sends): Calibration}`` from the calibration file (None: no calibrated columns)."""
    if path is None:
        return {}
    from isaac_net.core.diff.calibrate import Calibration

    return {(m, sd): Calibration.load(path, mode=m, sends=SEND_MODEL_OF_CODE[sd]) for m in params["modes"]
            for sd in params["sends"]}


def compute_op(params: dict, op_name: str, cals: dict, progress: bool = True, device: str = "cpu") -> dict:
    """One operating point: the detail rows of every (KPI, input, model) and the KPI values.
    Inputs are drawn on the CPU and moved to ``device``, so every device sees the same ones."""
    dtype = getattr(torch, params.get("dtype", "float32"))
    cfg = cell_config(params.get("cell", {}))
    op = ops_by_name(params)[op_name]
    n_seeds, T, warmup = (int(params[k]) for k in ("n_seeds", "T", "warmup"))
    per = int(op.get("envs_per_seed", params["envs_per_seed"]))
    R = int(op.get("R", params["R"]))
    steps = fd_steps_at(params, R)
    if op.get("optimum"):
        optimum_grid(params, op)  # a bad grid fails here, not after the finite differences
    models = [m for m in model_list(params) if not m[2] or (m[0], m[1]) in cals]
    # One stream per operating point, seeded by its name: a point's bootstrap depends neither on the
    # other points nor on their order (CRC-32, not hash(): the same in every process).
    rng = np.random.default_rng([int(params["seed"]), zlib.crc32(op_name.encode())])
    bar = (lambda xs, **kw: tqdm(xs, mininterval=2.0, **kw)) if progress else None
    base = problem(op, n_seeds, per, R, T, int(params["seed"]), dtype)
    base = {k: v.to(device) for k, v in base.items()}
    t0 = time.perf_counter()
    desc = f"{params['level']} FD {op_name}"
    fd, l2_vals = l2_fd(base, n_seeds, T, warmup, steps, int(params["seed"]), cfg, dtype, params["level"],
                        progress=(lambda xs, desc=desc: bar(xs, desc=desc)) if progress else None)
    t1 = time.perf_counter()
    setups = {}  # (mode, sends, calibrated) -> (the model's cell, its temperature)
    for mode, sends, calibrated in models:
        setups[(mode, sends, calibrated)] = cfg, float(params["tau"])
        if calibrated:  # the calibrated model for R robots per cell, at the temperature it was fitted at
            cal = cals[(mode, sends)].at(R)
            mcfg = cal.apply(cfg, R=R, area_m=op.get("area_m", [40.0, 140.0]))
            setups[(mode, sends, calibrated)] = mcfg, cal.tau
    grads, mvals = {}, {}
    for m in (models if not progress else bar(models, desc=f"models {op_name}")):
        mcfg, tau = setups[m]
        grads[m], mvals[m] = model_gradients(base, m[0], m[1], n_seeds, T, warmup, tau, float(params["lam"]),
                                             mcfg)
    t2 = time.perf_counter()
    values = {"op": op_name, "held_out": bool(op.get("held_out", False)), "p": float(op["p"]), "R": R,
              "envs_per_seed": per, "fd_step_p": steps["p"],
              "sizes_bytes": [float(b) for b in op["sizes_bytes"]], "tx_dbm": float(op.get("tx_dbm", 23.0)),
              "area_m": [float(x) for x in op.get("area_m", [40.0, 140.0])],
              "L2": {KPI_LABEL[k]: float(l2_vals[k].mean()) for k in KPIS},
              "models": {model_label(*m): {KPI_LABEL[k]: float(mvals[m][k].mean()) for k in KPIS}
                         for m in models}}
    detail = []
    for kpi in KPIS:
        for name in INPUTS:
            ref = fd[(kpi, name)].numpy()
            ref_mean, ref_se = float(ref.mean()), float(ref.std(ddof=1) / math.sqrt(n_seeds))
            significant = abs(ref_mean) > 2.0 * ref_se
            for m in models:
                g = grads[m][(kpi, name)].numpy()
                g_mean, g_std = float(g.mean()), float(g.std(ddof=1))
                ratio, lo, hi = ratio_ci(g, ref, int(params["n_boot"]), rng)
                # A model gradient below 1e-3 of the FD is numerically zero: its sign means nothing.
                is_zero = abs(g_mean) < ZERO_RATIO * abs(ref_mean)
                same_sign = bool(np.sign(g_mean) == np.sign(ref_mean)) and not is_zero
                agree = same_sign if significant else None
                verdict = ("fd_not_resolved" if not significant else "model_zero" if is_zero
                           else "sign_ok" if same_sign else "sign_wrong")
                within = (1.0 / WITHIN <= ratio <= WITHIN) if significant and math.isfinite(ratio) else None
                detail.append({"op": op_name, "held_out": values["held_out"], "R": R, "kpi": kpi,
                               "fitted": kpi in FITTED_KPIS, "input": name,
                               "derivative": f"d {KPI_LABEL[kpi]} / d {INPUT_LABEL[name]}",
                               "model": model_label(*m), "mode": m[0], "sends": m[1], "calibrated": m[2],
                               "grad_mean": g_mean, "grad_std": g_std, "fd_mean": ref_mean, "fd_se": ref_se,
                               "fd_significant": significant, "sign_agree": agree, "verdict": verdict,
                               "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi, "ratio_within_x2": within,
                               "ci": ("unbounded" if math.isinf(lo) else
                                      "none" if math.isnan(lo) else "bounded"),
                               "grad": g.tolist(), "fd": ref.tolist()})
    t3 = time.perf_counter()
    if op.get("optimum"):
        labelled = {model_label(*m): (m[0], m[1], *setups[m]) for m in models}
        values["optimum"] = optimum(params, op, base, labelled, cfg, dtype)
    return {"op": op_name, "values": values, "rows": detail, "wall_l2_fd_s": t1 - t0,
            "wall_models_s": t2 - t1, "wall_optimum_s": time.perf_counter() - t3}


def least_p(ps, values) -> tuple[float, bool]:
    """Where a KPI given on an ascending grid of send probabilities is least: the vertex of the
    parabola in log p through the grid's least value and its two neighbours, and whether it lies inside
    the grid (the first of tied least values). At an end of the grid, where the least may lie beyond
    it, that grid point and False.

    :input ps: ``[n]`` send probabilities, ascending, > 0, n >= 3. :input values: ``[n]`` the KPI there.
    """
    ps, v = np.asarray(ps, dtype=float), np.asarray(values, dtype=float)
    if ps.ndim != 1 or len(ps) < 3 or v.shape != ps.shape:
        raise ValueError(f"ps, values: expected two 1-d sequences of the same length >= 3, got {ps.shape} "
                         f"and {v.shape}")
    if not (np.all(np.isfinite(v)) and np.all(np.isfinite(ps)) and ps[0] > 0 and np.all(np.diff(ps) > 0)):
        raise ValueError(f"ps, values: expected ascending p > 0 and finite values, got {ps.tolist()} and "
                         f"{v.tolist()}")
    i = int(np.argmin(v))
    if i in (0, len(ps) - 1):
        return float(ps[i]), False
    a, b, _ = np.polyfit(np.log(ps[i - 1:i + 2]), v[i - 1:i + 2], 2)
    if not a > 0:
        return float(ps[i]), False
    return float(np.exp(-b / (2.0 * a))), True


def optimum_grid(params: dict, op: dict) -> list[float]:
    """The send probabilities of a point's optimum curve: its ``p`` times ``params["optimum"]["factors"]``."""
    spec = params.get("optimum")
    if not isinstance(spec, dict):
        raise ValueError(f"sensitivity.optimum: point {op['name']!r} asks for its optimum, so the stage "
                         f"needs {{kpi, factors}}, got {spec!r}")
    if spec.get("kpi") not in KPIS:
        raise ValueError(f"sensitivity.optimum.kpi: expected one of {list(KPIS)}, got {spec.get('kpi')!r}")
    factors = [float(f) for f in spec.get("factors", [])]
    ps = [float(op["p"]) * f for f in factors]
    ascending = all(b > a for a, b in zip(factors, factors[1:], strict=False))
    if len(ps) < 3 or factors[0] <= 0 or not ascending or ps[-1] > 1.0:
        raise ValueError(f"sensitivity.optimum.factors: expected at least 3 ascending factors > 0 whose "
                         f"largest keeps p <= 1 at point {op['name']!r} (p {op['p']}), got {factors}")
    return ps


def optimum(params: dict, op: dict, base: dict, setups: dict, cfg, dtype) -> dict:
    """Where the KPI ``params["optimum"]["kpi"]`` is least in the send probability at a point, on the
    level and on each model, and the level's KPI at each model's choice: what an optimiser of p that
    follows the model gives up on the level.

    Every p of the grid (``optimum_grid``) runs on the point's replicates (positions, sizes, send
    uniforms, the level's engine seed): common random numbers along the curve. ``setups``:
    ``{label: (mode, sends, cfg, tau)}`` of the models. The least of each curve is ``least_p``'s; the
    level then runs again at each such p.

    :output: ``{"kpi", "p": [n], "L2": {"curve": [n], "best_p", "inside", "at_best"}, "models": {label:
        {"curve", "best_p", "inside", "L2_at_best", "L2_lost"}}}``, means over the replicates;
        ``L2_lost``: the level's KPI at the model's p over its KPI at its own, minus one.
    """
    kpi, ps = params["optimum"]["kpi"], optimum_grid(params, op)
    n_seeds, T, warmup = (int(params[k]) for k in ("n_seeds", "T", "warmup"))
    x0 = inputs_at(base, {}, n_seeds)

    def at(p):
        return {**x0, "p": torch.full_like(x0["p"], p)}

    def on_level(p):
        return float(level_kpis(base, at(p), n_seeds, T, warmup, int(params["seed"]), cfg, dtype,
                                params["level"])[kpi].mean())

    curve = [on_level(p) for p in ps]
    best, inside = least_p(ps, curve)
    least = on_level(best)
    out = {"kpi": KPI_LABEL[kpi], "p": ps,
           "L2": {"curve": curve, "best_p": best, "inside": inside, "at_best": least}, "models": {}}
    for label, (mode, sends, mcfg, tau) in setups.items():
        with torch.no_grad():
            mc = [float(model_kpis(base, at(p), mode, sends, n_seeds, T, warmup, tau, float(params["lam"]),
                                   mcfg)[kpi].mean()) for p in ps]
        mbest, minside = least_p(ps, mc)
        there = on_level(mbest)
        out["models"][label] = {"curve": mc, "best_p": mbest, "inside": minside, "L2_at_best": there,
                                "L2_lost": there / least - 1.0}
    return out


def _metrics(rows: list[dict]) -> dict:
    """Sign agreement, median ratio, ratio within x2 and CI coverage of 1 over the resolved rows."""
    sig = [d for d in rows if d["fd_significant"]]
    ratios = [d["ratio"] for d in sig if math.isfinite(d["ratio"])]

    def frac(xs):
        return sum(xs) / len(xs) if xs else None

    return {"resolved_rows": len(sig), "sign_agree_frac": frac([d["sign_agree"] for d in sig]),
            "median_ratio": float(np.median(ratios)) if ratios else None,
            "within_x2_frac": frac([bool(d["ratio_within_x2"]) for d in sig]),
            "ci_covers_1_frac": frac([_covers_1(d["ratio_lo"], d["ratio_hi"]) for d in sig])}


def _covers_1(lo: float | None, hi: float | None) -> bool:
    """Whether a ratio's interval covers 1: not where it has none (a model gradient that is the same in
    every replicate, zero at a saturated point, has no bootstrap interval: NaN, null in the artifact)."""
    return lo is not None and hi is not None and lo <= 1.0 <= hi


def _bar(bar: dict | None, metrics: list[dict]) -> list[dict]:
    """The fleet-size issue's bar (config ``bar``): per model of ``bar["models"]`` and fleet size of
    ``bar["R"]``, that size's point group (``metrics``' ``"R<n>"``): sign agreement at least
    ``sign_agree_min`` and median ratio within ``median_ratio``. A model or size without a point
    group (no points there, or no resolved rows) does not hold it (``measured`` False)."""
    if not bar:
        return []
    lo, hi = bar["median_ratio"]
    out = []
    for model in bar["models"]:
        for R in bar["R"]:
            m = next((m for m in metrics if m["model"] == model and m["points"] == f"R{int(R)}"), None)
            sign = None if m is None else m["sign_agree_frac"]
            median = None if m is None else m["median_ratio"]
            row = {"model": model, "R": int(R), "measured": sign is not None and median is not None,
                   "resolved_rows": 0 if m is None else m["resolved_rows"], "sign_agree_frac": sign,
                   "median_ratio": median, "sign_agree_min": float(bar["sign_agree_min"]),
                   "median_ratio_range": [float(lo), float(hi)]}
            row["sign_met"] = sign is not None and sign >= bar["sign_agree_min"]
            row["median_met"] = median is not None and lo <= median <= hi
            row["met"] = row["sign_met"] and row["median_met"]
            out.append(row)
    return out


def merge(params: dict, parts: list[dict], cals: dict) -> dict:
    """The artifact payload from the per-point parts: summary, metrics per model and point group,
    the table (one row per derivative and point, one entry per model) and the values."""
    detail = [d for part in parts for d in part["rows"]]
    labels = list(dict.fromkeys(d["model"] for d in detail))
    # The agreement of the KPIs the calibration fits (its targets are stated on them), and apart
    # from it that of each other KPI (throughput), so a KPI added to the registry moves no target.
    metrics, metrics_other = [], []
    sizes = sorted({d["R"] for d in detail})
    for label in labels:
        mine = [d for d in detail if d["model"] == label]
        # The point groups: the stage points, the held-out points, and (with several fleet sizes)
        # every fleet size's points ("R<n>").
        groups = [("stage", [d for d in mine if not d["held_out"]]),
                  ("held_out", [d for d in mine if d["held_out"]])]
        groups += [(f"R{r}", [d for d in mine if d["R"] == r]) for r in sizes] if len(sizes) > 1 else []
        for group, rows in groups:
            if not rows:
                continue
            m0 = rows[0]
            head = {"model": label, "mode": m0["mode"], "sends": m0["sends"], "calibrated": m0["calibrated"],
                    "points": group, **({"R": m0["R"]} if group.startswith("R") else {})}
            metrics.append({**head, **_metrics([d for d in rows if d["fitted"]])})
            for kpi in KPIS:
                if kpi not in FITTED_KPIS:
                    metrics_other.append({**head, "kpi": kpi, "label": KPI_LABEL[kpi],
                                          **_metrics([d for d in rows if d["kpi"] == kpi])})
    table = []
    for part in parts:
        for kpi in KPIS:
            for name in INPUTS:
                cells = [d for d in part["rows"] if d["kpi"] == kpi and d["input"] == name]
                d0 = cells[0]
                keep = ("grad_mean", "grad_std", "ratio", "ratio_lo", "ratio_hi", "ci", "verdict")
                table.append({"op": part["op"], "held_out": d0["held_out"], "derivative": d0["derivative"],
                              "fd_mean": d0["fd_mean"], "fd_se": d0["fd_se"],
                              "fd_significant": d0["fd_significant"],
                              "models": {d["model"]: {k: d[k] for k in keep} for d in cells}})
    summary = {"level": params["level"], "n_seeds": int(params["n_seeds"]),
               "envs_per_seed": int(params["envs_per_seed"]), "robots": int(params["R"]),
               "T": int(params["T"]),
               "warmup": int(params["warmup"]), "tau": float(params["tau"]), "lam": float(params["lam"]),
               "ratio_ci_pct": 95, "within": WITHIN, "zero_ratio": ZERO_RATIO,
               **{f"fd_step_{k}": float(v) for k, v in params["fd_steps"].items()},
               "points": len(parts), "held_out_points": sum(p["values"]["held_out"] for p in parts),
               "calibrated": bool(cals), "rows": len(table),
               "wall_l2_fd_s": sum(p["wall_l2_fd_s"] for p in parts),
               "wall_models_s": sum(p["wall_models_s"] for p in parts),
               "wall_optimum_s": sum(p.get("wall_optimum_s", 0.0) for p in parts)}
    targets = []
    t = params.get("targets")
    if t:
        lo, hi = t["median_ratio"]
        for m in metrics:
            if m["model"] in t["models"]:
                checks = {"sign_agree": (m["sign_agree_frac"], t["sign_agree_min"]),
                          "within_x2": (m["within_x2_frac"], t["within_x2_min"])}
                met = {k: (v is not None and v >= need) for k, (v, need) in checks.items()}
                met["median_ratio"] = m["median_ratio"] is not None and lo <= m["median_ratio"] <= hi
            elif m["model"] == "L1D mf cal":
                met = {"sign_agree": m["sign_agree_frac"] is not None
                       and m["sign_agree_frac"] >= t["l1d_mf_sign_agree_min"]}
            else:
                continue
            targets.append({"model": m["model"], "points": m["points"], **({"R": m["R"]} if "R" in m else {}),
                            **{f"{k}_met": v for k, v in met.items()}, "met": all(met.values())})
    for m in metrics:  # flat keys the template quotes
        key = m["model"].replace(" ", "_")
        for k in ("sign_agree_frac", "median_ratio", "within_x2_frac", "ci_covers_1_frac"):
            summary[f"{key}_{m['points']}_{k}"] = m[k]
    summary["targets_all_met"] = all(x["met"] for x in targets) if targets else None
    bar = _bar(params.get("bar"), metrics)
    summary["bar_met"] = all(x["met"] for x in bar) if bar else None
    return {"summary": summary, "metrics": metrics, "targets": targets, "bar": bar, "table": table,
            "metrics_other_kpis": metrics_other,
            "kpis": [{"label": k.label, "unit": k.unit, "fitted": k.batch_key in FITTED_KPIS}
                     for k in kpi_registry.KPIS], "values": [p["values"] for p in parts], "rows": detail,
            "config": params}


def compute(params: dict, progress: bool = True, device: str = "cpu", calibration: str | None = None) -> dict:
    """The whole study in one process (every point, then ``merge``); returns the artifact payload."""
    cals = load_calibrations(calibration, params)
    parts = [compute_op(params, name, cals, progress, device) for name in ops_by_name(params)]
    return merge(params, parts, cals)


def _read_part(path: str) -> dict:
    """A point's part as :func:`compute_op` returned it: the ratios and their bounds that the artifact
    writes as null where they are not finite (NaN: no bootstrap interval) back to NaN."""
    part = json.loads(open(path).read())
    for d in part["rows"]:
        for k in ("ratio", "ratio_lo", "ratio_hi"):
            if d[k] is None:
                d[k] = math.nan
    return part


def main(stage, params: dict, out: dict, part: str | None = None) -> None:
    """Gradients of L1D and QAD (uncalibrated and calibrated) against L2-legacy finite differences
    with CRN: one part per operating point (``op-<name>``), then ``merge``."""
    torch.manual_seed(int(params["seed"]))
    cals = load_calibrations(out.get("calibration"), params)
    if part is not None and part.startswith("op-"):
        stage.write_json(out["json"], compute_op(params, part[3:], cals, device=stage.device))
        return
    if part not in (None, "merge"):
        raise ValueError(f"part: expected op-<name> or merge, got {part!r}")
    if "parts" in out:
        parts = [_read_part(path) for path in out["parts"]]
        parts.sort(key=lambda x: list(ops_by_name(params)).index(x["op"]))
        payload = merge(params, parts, cals)
    else:
        payload = compute(params, device=stage.device, calibration=out.get("calibration"))
    fig_name = None
    if "figure" in out:
        gradient_ratios(payload["rows"], out["figure"], WITHIN)
        fig_name = out["figure"].rsplit("/", 1)[-1]
    stage.write_json(out["json"], {**payload, **({"figure": fig_name} if fig_name else {})})


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
