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
many to (the default 0.05 changes about 10 % of the sends).

Comparison per row: sign agreement of the model's mean with the FD mean (counted only
where the FD differs from zero by more than two standard errors; a model gradient below
``ZERO_RATIO`` of the FD counts as a disagreement, "model gradient ~ 0"), and the
magnitude ratio model / FD with a paired bootstrap 95 % interval over replicates.
"""


import math
import time

import numpy as np
import torch
from tqdm import tqdm

try:
    from _common import cell_config, generator, run
except ImportError:  # imported as benchmarks.diff.sensitivity (tests)
    from benchmarks.diff._common import cell_config, generator, run

KPIS = ("mean_delay", "delivery_ratio", "mean_aoi", "mean_energy_j")
KPI_LABEL = {"mean_delay": "delay", "delivery_ratio": "delivery", "mean_aoi": "AoI",
             "mean_energy_j": "energy"}
INPUTS = ("p", "kbytes", "tx_db", "dist_m")
INPUT_LABEL = {"p": "p", "kbytes": "kB", "tx_db": "tx dB", "dist_m": "dist m"}
SENDS = {"mf": "mean_field", "rb": "relaxed"}
ZERO_RATIO = 1e-3  # |model / FD| below this counts as a zero model gradient (a sign disagreement)


def problem(op: dict, n_seeds: int, envs_per_seed: int, R: int, T: int, seed: int, dtype) -> dict:
    """Base inputs of all replicates, batched along envs (replicate ``s`` = envs
    ``[s * envs_per_seed, (s + 1) * envs_per_seed)``).

    :output p, B, tx, d, dir, u: ``[E, R]`` (``dir`` ``[E, R, 2]``, ``u`` ``[T, E, R]``),
        ``E = n_seeds * envs_per_seed``; positions uniform in ``op["area_m"]`` squared.
    """
    parts = []
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
    """Per-replicate batch KPIs ``[n_seeds]`` from a rollout's per-robot totals (totals over totals)."""
    def grp(x):
        return x.reshape(n_seeds, -1)

    return {
        "mean_delay": grp(res["delay_sum"]).sum(-1) / grp(res["delivered"]).sum(-1),
        "delivery_ratio": grp(res["delivered"]).sum(-1) / grp(res["offered"]).sum(-1),
        "mean_aoi": grp(res["aoi"]).mean(-1),
        "mean_energy_j": grp(res["energy_j"]).mean(-1),
    }


def model_gradients(base, mode, sends, n_seeds, T, warmup, tau, lam, cfg) -> dict:
    """Autograd derivatives ``{(kpi, input): [n_seeds]}`` and KPI values ``{kpi: [n_seeds]}``."""
    from isaac_net.core.diff import DiffFluid, rollout

    E, R = base["p"].shape
    dev = base["p"].device
    shift = {k: torch.zeros(n_seeds, dtype=base["p"].dtype, device=dev, requires_grad=True) for k in INPUTS}
    x = inputs_at(base, shift, n_seeds)
    net = DiffFluid(E, R, dev, mode=mode, tau=tau, cfg=cfg, dtype=base["p"].dtype)
    res = rollout(net, T, x["p"], x["B"], pos=x["pos"], tx_dbm=x["tx_dbm"], warmup=warmup,
                  sends=SENDS[sends], u=base["u"] if sends == "rb" else None, lam=lam)
    k = replicate_kpis(res, n_seeds)
    grads = {}
    for i, kpi in enumerate(KPIS):
        g = torch.autograd.grad(k[kpi].sum(), [shift[n] for n in INPUTS], retain_graph=i < len(KPIS) - 1,
                                allow_unused=True)
        for name, gi in zip(INPUTS, g, strict=True):
            grads[(kpi, name)] = (torch.zeros(n_seeds) if gi is None else gi.detach().cpu()).double()
    return grads, {kpi: v.detach().cpu().double() for kpi, v in k.items()}


def l2_fd(base, n_seeds, T, warmup, steps, engine_seed, cfg, dtype, level,
          progress=None) -> tuple[dict, dict]:
    """Central FD ``{(kpi, input): [n_seeds]}`` of ``level`` with CRN, and its KPIs at the base point."""
    from isaac_net.core.diff.reference import discrete_rollout

    def kpis_at(shift):
        x = inputs_at(base, shift, n_seeds)
        res = discrete_rollout(level, T, x["p"], x["B"], pos=x["pos"], tx_dbm=x["tx_dbm"], warmup=warmup,
                               u=base["u"], cfg=cfg, dtype=dtype, seed=engine_seed, device=base["p"].device)
        return {k: v.cpu().double() for k, v in replicate_kpis(res, n_seeds).items()}

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


def ratio_ci(model: np.ndarray, ref: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple:
    """Ratio of means model / ref and its paired percentile bootstrap 95 % interval over replicates."""
    ratio = float(model.mean() / ref.mean()) if ref.mean() != 0 else math.nan
    idx = rng.integers(0, len(ref), size=(n_boot, len(ref)))
    num, den = model[idx].mean(1), ref[idx].mean(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = num / den
    r = r[np.isfinite(r)]
    if len(r) < n_boot // 2:
        return ratio, math.nan, math.nan
    lo, hi = np.percentile(r, [2.5, 97.5])
    # A bootstrap distribution of a ratio whose denominator crosses zero is not an interval.
    if (den > 0).mean() not in (0.0, 1.0) and min((den > 0).mean(), (den < 0).mean()) > 0.025:
        return ratio, -math.inf, math.inf
    return ratio, float(lo), float(hi)


def compute(params: dict, progress: bool = True, device: str = "cpu") -> dict:
    """The whole study; returns the artifact payload (without provenance) and figure data.
    Inputs are drawn on the CPU and moved to ``device``, so every device sees the same ones."""
    dtype = getattr(torch, params.get("dtype", "float32"))
    cfg = cell_config(params.get("cell", {}))
    n_seeds, per, R, T, warmup = (int(params[k]) for k in ("n_seeds", "envs_per_seed", "R", "T", "warmup"))
    steps = params["fd_steps"]
    models = [(m, s) for m in params["modes"] for s in params["sends"]]
    rng = np.random.default_rng(int(params["seed"]))
    bar = (lambda xs, **kw: tqdm(xs, mininterval=2.0, **kw)) if progress else None
    rows, detail, ref_point = [], [], None
    values = []
    wall = {"l2": 0.0, "models": 0.0}
    for op_name, op in params["ops"].items():
        base = problem(op, n_seeds, per, R, T, int(params["seed"]), dtype)
        base = {k: v.to(device) for k, v in base.items()}
        t0 = time.perf_counter()
        desc = f"{params['level']} FD {op_name}"
        fd, l2_vals = l2_fd(base, n_seeds, T, warmup, steps, int(params["seed"]), cfg, dtype, params["level"],
                            progress=(lambda xs, desc=desc: bar(xs, desc=desc)) if progress else None)
        t1 = time.perf_counter()
        wall["l2"] += t1 - t0
        grads, mvals = {}, {}
        it = models if not progress else bar(models, desc=f"models {op_name}")
        for mode, sends in it:
            grads[(mode, sends)], mvals[(mode, sends)] = model_gradients(
                base, mode, sends, n_seeds, T, warmup, float(params["tau"]), float(params["lam"]), cfg)
        wall["models"] += time.perf_counter() - t1
        lvl = params["level"]
        values.append({"op": op_name, "p": op["p"], **{f"{lvl}_{KPI_LABEL[k]}": float(l2_vals[k].mean())
                                                       for k in KPIS},
                       **{f"{m}D_{s}_{KPI_LABEL[k]}": float(mvals[(m, s)][k].mean())
                          for (m, s) in models for k in KPIS}})
        for kpi in KPIS:
            for name in INPUTS:
                ref = fd[(kpi, name)].numpy()
                ref_mean, ref_se = float(ref.mean()), float(ref.std(ddof=1) / math.sqrt(n_seeds))
                significant = abs(ref_mean) > 2.0 * ref_se
                row = {"op": op_name, "derivative": f"d {KPI_LABEL[kpi]} / d {INPUT_LABEL[name]}",
                       "L2-legacy FD": f"{_f(ref_mean)} ± {_f(ref_se)}"}
                for mode, sends in models:
                    g = grads[(mode, sends)][(kpi, name)].numpy()
                    g_mean, g_std = float(g.mean()), float(g.std(ddof=1))
                    ratio, lo, hi = ratio_ci(g, ref, int(params["n_boot"]), rng)
                    # A model gradient below 1e-3 of the FD is numerically zero: its sign means nothing.
                    is_zero = abs(g_mean) < ZERO_RATIO * abs(ref_mean)
                    same_sign = bool(np.sign(g_mean) == np.sign(ref_mean)) and not is_zero
                    agree = same_sign if significant else None
                    label = f"{mode}D {sends}"
                    verdict = {True: "sign ok", False: "sign WRONG", None: "FD ~ 0"}[agree]
                    if is_zero and significant:
                        verdict = "model gradient ~ 0"
                    row[label] = (f"{_f(g_mean)} ± {_f(g_std)}; ratio {_f(ratio)} [{_f(lo)}, {_f(hi)}]; "
                                  f"{verdict}")
                    detail.append({"op": op_name, "kpi": kpi, "input": name, "model": label,
                                   "grad_mean": g_mean, "grad_std": g_std,
                                   "fd_mean": ref_mean, "fd_se": ref_se,
                                   "fd_significant": significant, "sign_agree": agree, "ratio": ratio,
                                   "ratio_lo": lo, "ratio_hi": hi, "grad": g.tolist(), "fd": ref.tolist()})
                    if (mode, sends, kpi, name) == ("QA", "rb", "mean_aoi", "tx_db") and op["p"] == 0.5:
                        ref_point = (g_mean, g_std)
                rows.append(row)
    setup = {
        "fd_p_note": (f"binary sends u < p: the FD in p is that of a step function averaged over seeds; "
                      f"h = {_f(float(steps['p']))} changes the sends whose uniform lies within h of p"),
        "level": params["level"],
        "n_seeds": n_seeds,
        "envs_per_seed": per,
        "robots": R,
        "T": T,
        "warmup": warmup,
        "tau": float(params["tau"]),
        "lam": float(params["lam"]),
        "ratio_ci_pct": 95,
        **{f"fd_step_{k}": float(v) for k, v in steps.items()},
        "fd_significant_rows": sum(1 for d in detail if d["fd_significant"]) // max(len(models), 1),
        "rows": len(rows),
    }
    summary = {}
    for mode, sends in models:
        label = f"{mode}D {sends}"
        mine = [d for d in detail if d["model"] == label]
        sig = [d for d in mine if d["fd_significant"]]
        ratios = [d["ratio"] for d in sig if math.isfinite(d["ratio"])]
        key = f"{mode}D_{sends}"
        summary[f"{key}_sign_agree_frac"] = (sum(d["sign_agree"] for d in sig) / len(sig)) if sig else None
        summary[f"{key}_median_ratio"] = float(np.median(ratios)) if ratios else None
        covers = [d["ratio_lo"] <= 1.0 <= d["ratio_hi"] for d in sig]
        summary[f"{key}_ratio_ci_covers_1_frac"] = (sum(covers) / len(sig)) if sig else None
    if ref_point is not None:
        summary["QAD_rb_dAoI_dtx_at_p0.5"] = ref_point[0]
        summary["QAD_rb_dAoI_dtx_at_p0.5_std"] = ref_point[1]
    for v in values:
        for kpi in KPIS:
            name = f"{params['level']}_{KPI_LABEL[kpi]}"
            summary[f"{v['op']}_{name}"] = v[name]
    summary.update(setup)
    summary.update({"wall_l2_fd_s": wall["l2"], "wall_models_s": wall["models"]})
    return {"summary": summary, "table": rows, "values": values, "rows": detail,
            "config": params}


def _f(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "inf" if x == math.inf else ("-inf" if x == -math.inf else "n/a")
    if x == 0:
        return "0"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"


def figure(detail: list[dict], path: str) -> None:
    """Ratio model gradient / L2-legacy FD with its 95 % interval, one panel per operating
    point, one column of markers per derivative the FD resolves (symlog axis: a negative
    ratio is a sign disagreement; 1 is agreement in sign and size)."""
    try:
        from _plots import save
    except ImportError:
        from benchmarks.diff._plots import save
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(d["model"] for d in detail))
    ops = list(dict.fromkeys(d["op"] for d in detail))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(len(ops), 1, figsize=(11.0, 3.6 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops, strict=True):
        labels = list(dict.fromkeys(f"d {KPI_LABEL[d['kpi']]} / d {INPUT_LABEL[d['input']]}" for d in detail
                                    if d["op"] == op and d["fd_significant"]))
        for j, m in enumerate(models):
            rows = [d for d in detail if d["op"] == op and d["model"] == m and d["fd_significant"]]
            xs, ys, lo, hi = [], [], [], []
            for d in rows:
                x = labels.index(f"d {KPI_LABEL[d['kpi']]} / d {INPUT_LABEL[d['input']]}")
                r = max(min(d["ratio"], 1e3), -1e3)
                xs.append(x + (j - (len(models) - 1) / 2) * 0.15)
                ys.append(r)
                l_, h_ = d["ratio_lo"], d["ratio_hi"]
                lo.append(r - max(min(l_, 1e3), -1e3) if math.isfinite(l_) else 0.0)
                hi.append(max(min(h_, 1e3), -1e3) - r if math.isfinite(h_) else 0.0)
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", ms=4, color=colors[j % len(colors)], label=m,
                        elinewidth=0.8)
        ax.axhline(1.0, color="k", ls=":", lw=0.8)
        ax.axhline(0.0, color="grey", lw=0.5)
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("model / L2-legacy FD")
        ax.set_title(f"operating point {op}: derivatives the FD resolves (|mean| > 2 SE), 95 % CI",
                     fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=len(models))
    fig.tight_layout()
    save(fig, path)


def main(stage, params: dict, out: dict) -> None:
    """Gradients of L1D and QAD against L2-legacy finite differences with CRN."""
    torch.manual_seed(int(params["seed"]))
    payload = compute(params, device=stage.device)
    fig_name = None
    if "figure" in out:
        figure(payload["rows"], out["figure"])
        fig_name = out["figure"].rsplit("/", 1)[-1]
    s = payload["summary"]
    for k, v in s.items():
        print(f"  {k}: {v}")
    stage.write_json(out["json"], {**payload, **({"figure": fig_name} if fig_name else {})})


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
